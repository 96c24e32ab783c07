"""`nmt import` of a base-size released model, and the decoding speed of what it gives against a
native nmt-cli model of the same shape: `python tests/benchmarks/import_speed.py --work DIR
[--scale 1.0] [--lines 300] [--threads 2] [--repeats 2]`.

The release is OPUS-MT en-mg's own configuration and tokenizer files (../shared/data) with random
weights (transformers' MarianMTModel, saved as model.safetensors: 74M parameters, about 300 MB;
`--scale` shrinks d_model for a quick run). `nmt import` runs in a child process: its wall time
and peak RSS (against the size of model.safetensors). Then the imported model and a native one of
the same sizes (6+6 layers, d_model 512, the same vocabulary) translate the first `--lines`
lines of test_2016_flickr.en, alternately, with one search (beam 4, exactly 30 tokens a sentence:
</s> comes only at the limit in both: a bias in the release, a banned token in the native one), so
both do the same work, model loading excluded. One JSON
line: import seconds, its peak RSS, that of a process importing the same libraries and nothing
else (Python and PyTorch's own), the rest over the model's size, and each model's target tokens/s
(the best of the repeats).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import SHARED

from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.released import Released
from nmt_cli.model.transformer import Transformer
from nmt_cli.run_config import RunConfig
from nmt_cli.text.vocab import PAD_ID


def release(directory: Path, scale: float) -> Path:
    """en-mg's release with random weights (d_model times `scale`)."""
    from transformers import MarianConfig, MarianMTModel

    en_mg = SHARED / "opus-mt-en-mg"
    config = json.loads((en_mg / "config.json").read_text())
    d_model = int(config["d_model"] * scale) // 8 * 8
    config.update(d_model=d_model, encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model)
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig.from_dict(config))
    with torch.no_grad():
        model.final_logits_bias[0, config["eos_token_id"]] = -1e4  # no sentence ends before the limit
    model.save_pretrained(directory)
    (directory / "generation_config.json").unlink()
    (directory / "config.json").write_text(json.dumps(config))
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(en_mg / name, directory / name)
    return directory


def peak_mb(*command: str) -> float:
    """The peak RSS in MB of `command`, run in a child of a child (whose children's peak is its)."""
    measure = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", measure, *command], check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1]) / 1024


def imported(directory: Path, out: Path) -> tuple[float, float, float]:
    """`nmt import` in a child process: its wall seconds, its peak RSS in MB, and the peak RSS of a
    process that only imports what it imports (Python, PyTorch, safetensors, SentencePiece)."""
    start = time.perf_counter()
    peak = peak_mb(sys.executable, "-m", "nmt_cli", "import", str(directory), "-o", str(out))
    seconds = time.perf_counter() - start
    baseline = peak_mb(sys.executable, "-c",
                       "import nmt_cli.cli, nmt_cli.interop.importer, sentencepiece, safetensors.torch")
    return seconds, peak, baseline


def native(like: Path, out: Path) -> Path:
    """A model trained here from nothing (random), of the imported one's sizes and vocabulary: the
    paper's post-norm ReLU Transformer with a tied output and no output bias."""
    bundle = ckpt.load_bundle(like)
    config = bundle.model.config.replace(activation="relu", output_bias=False)
    torch.manual_seed(0)
    model = Transformer(config, len(bundle.src_vocab), len(bundle.tgt_vocab), PAD_ID, bundle.shared)
    never_ends = Released(never_output=("</s>",))  # forced at the limit only, as the import's bias makes it
    ckpt.save(ckpt.describe(model, bundle.text, None, bundle.src_vocab, bundle.tgt_vocab, bundle.sentencepiece,
                            bundle.target_sentencepiece, never_ends), out)
    return out


def tokens_per_second(engine: Engine, lines: list[str]) -> float:
    sources = [engine.pipeline.source_ids(line, k + 1) for k, line in enumerate(lines)]
    start = time.perf_counter()
    found = engine.generator.search(sources, engine.config.search)
    seconds = time.perf_counter() - start
    return sum(len(h[0].tokens) + 1 for h in found if h) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    directory = release(args.work / "release", args.scale)
    seconds, peak, baseline = imported(directory, args.work / "imported.pt")
    native(args.work / "imported.pt", args.work / "native.pt")
    torch.set_num_threads(args.threads)
    lines = (SHARED / "multi30k" / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:args.lines]
    search = SearchConfig(beam=4, max_len_a=0, max_len_b=30)
    engines = {}
    for name in ("imported", "native"):
        engines[name] = Engine([ckpt.load_bundle(args.work / f"{name}.pt")], RunConfig(search=search),
                                       torch.device("cpu"))
    speeds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            speeds[name].append(tokens_per_second(engine, lines))
    size_mb = (directory / "model.safetensors").stat().st_size / 2**20
    print(json.dumps({"benchmark": "import_speed", "model_mb": round(size_mb), "import_s": round(seconds, 2),
                      "import_peak_rss_mb": round(peak), "runtime_rss_mb": round(baseline),
                      "model_part_over_size": round((peak - baseline) / size_mb, 2),
                      "threads": args.threads, "lines": len(lines),
                      **{f"{name}_target_tokens_per_s": round(max(s), 1) for name, s in speeds.items()}}))


if __name__ == "__main__":
    main()
