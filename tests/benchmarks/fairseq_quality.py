"""fairseq's published Multi30k recipe beside the quickstart, on the same time budget and machine:
`python tests/benchmarks/fairseq_quality.py --work W --minutes 25 --fairseq-bin VENV/bin [--ours Q]`.

The peer (Wu et al., ACL 2021, "Good for Misconceived Reasons", their text-only Transformer-tiny,
41.0 lowercased tokenized BLEU on test2016 at 8,000 updates): 4+4 layers, d_model 128, FFN 256,
4 heads, all embeddings shared over a joined dictionary, dropout 0.3, Adam (0.9, 0.98) at lr 0.005
with 2,000 warmup updates and inverse-sqrt decay, label smoothing 0.1, 4,096 tokens a batch, the
last 10 epoch checkpoints averaged, beam 5. From raw Multi30k text with its own tools (the fairseq
venv's sacremoses: Moses tokenization, case kept; subword-nmt: 10,000 joint BPE merges), trained
with fairseq 0.12.2 (`../shared/peers/install_fairseq.sh`) on the CPU until `--max-update 8000` or
`--minutes` of training (`--stop-time-hours`), whichever comes first; its output BPE removed and
detokenized (sacremoses), scored with sacreBLEU (13a) on raw val and test_2016_flickr.

Ours: the quickstart (`data/quickstart.sh`, its recipe in data/quickstart.yaml) for the same
`--minutes`, its average translated as the quickstart does (beam 4, length penalty 1.5); `--ours Q`
takes a finished quickstart's WORK directory instead (run on the same machine). Prints one JSON
line: each side's updates, val and test BLEU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED  # noqa: E402

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # fairseq's names: Multi30k's
RECIPE = ["--arch", "transformer", "--share-all-embeddings", "--encoder-layers", "4", "--decoder-layers", "4",
          "--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "256",
          "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
          "--dropout", "0.3", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.005",
          "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2000", "--criterion",
          "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "4096",
          "--max-update", "8000"]
AVERAGE = """
import sys, torch
paths, out = sys.argv[1:-1], sys.argv[-1]
states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
total = {k: sum(s["model"][k].double() for s in states) / len(states) for k in states[-1]["model"]}
last = states[-1]; last["model"] = {k: v.to(states[-1]["model"][k].dtype) for k, v in total.items()}
torch.save(last, out)
"""


def run(*args: object, stdin: Path | None = None, stdout: Path | None = None, env: dict | None = None) -> str:
    """A command's stdout and stderr (stdout into a file when given), or the end of its stderr."""
    with open(stdin or os.devnull, "rb") as source:
        if stdout:
            with open(stdout, "wb") as sink:
                result = subprocess.run(list(map(str, args)), stdin=source, stdout=sink, stderr=subprocess.PIPE,
                                        env=env, check=False)
        else:
            result = subprocess.run(list(map(str, args)), stdin=source, capture_output=True, env=env, check=False)
    if result.returncode:
        raise SystemExit(f"{args[0]} failed:\n{result.stderr.decode()[-3000:]}")
    return (result.stdout or b"").decode() + result.stderr.decode()


def prepare(work: Path, bin_: Path, merges: int, threads: int) -> Path:
    """Moses tokens, joint BPE, fairseq-preprocess with a joined dictionary: the data-bin folder."""
    raw, tok = SHARED / "multi30k", work / "tok"
    tok.mkdir(parents=True, exist_ok=True)
    for split, name in SPLITS.items():
        for lang in ("en", "de"):
            run(bin_ / "sacremoses", "-l", lang, "-j", threads, "tokenize",
                stdin=raw / f"{name}.{lang}", stdout=tok / f"{split}.tok.{lang}")
    codes = tok / "codes"
    run(bin_ / "subword-nmt", "learn-joint-bpe-and-vocab", "-s", merges, "-o", codes, "--input",
        tok / "train.tok.en", tok / "train.tok.de", "--write-vocabulary", tok / "vocab.en", tok / "vocab.de")
    for split in SPLITS:
        for lang in ("en", "de"):
            run(bin_ / "subword-nmt", "apply-bpe", "-c", codes, "--vocabulary", tok / f"vocab.{lang}",
                stdin=tok / f"{split}.tok.{lang}", stdout=tok / f"{split}.{lang}")
    data = work / "data-bin"
    run(bin_ / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
        "--trainpref", tok / "train", "--validpref", tok / "valid", "--testpref", tok / "test",
        "--destdir", data, "--workers", threads)
    return data


def train(work: Path, data: Path, bin_: Path, minutes: float, threads: int) -> tuple[int, list[Path]]:
    """fairseq-train for `minutes` of training (unless an earlier run of this benchmark finished
    it): its updates and the last 10 epoch checkpoints."""
    save, done = work / "checkpoints", work / "train.log"
    if not done.exists():
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        log = run(bin_ / "fairseq-train", data, *RECIPE, "--cpu", "--save-dir", save, "--keep-last-epochs", "10",
                  "--no-last-checkpoints", "--stop-time-hours", minutes / 60, "--log-format", "simple",
                  "--log-interval", "100", "--seed", "1", env=env)
        done.write_text(log)
    log = done.read_text()
    updates = max(int(n) for n in re.findall(r"num_updates[ =:]+(\d+)", log))
    epochs = sorted(save.glob("checkpoint[0-9]*.pt"), key=lambda p: int(re.sub(r"\D", "", p.name)))
    return updates, epochs[-10:]


def translate(work: Path, data: Path, bin_: Path, model: Path, split: str, threads: int) -> list[str]:
    """fairseq-generate's beam-5 output of `split`, BPE removed, detokenized, in input order."""
    # fairseq 0.12.2 pickles its options; torch >= 2.6 loads weights only unless told
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    out = run(bin_ / "fairseq-generate", data, "--path", model, "--gen-subset", split, "--beam", "5",
              "--remove-bpe", "--batch-size", "128", "--cpu", env=env)
    hyps = dict(sorted((int(m[1]), m[2]) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)))
    tokens = work / f"{split}.hyp.tok"
    tokens.write_text("".join(hyps[i] + "\n" for i in range(len(hyps))), encoding="utf-8")
    detok = work / f"{split}.hyp.de"
    run(bin_ / "sacremoses", "-l", "de", "-j", threads, "detokenize", stdin=tokens, stdout=detok)
    return detok.read_text(encoding="utf-8").splitlines()


def bleu(hyps: list[str], split: str) -> float:
    refs = (SHARED / "multi30k" / f"{SPLITS[split]}.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(refs), f"{split}: {len(hyps)} outputs for {len(refs)} references"
    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def fairseq_side(work: Path, bin_: Path, minutes: float, threads: int, merges: int) -> dict:
    data = work / "data-bin" if (work / "train.log").exists() else prepare(work, bin_, merges, threads)
    updates, last = train(work, data, bin_, minutes, threads)
    model = work / "average.pt"
    run(bin_ / "python", "-c", AVERAGE, *last, model)
    return {"updates": updates, "averaged": [p.name for p in last],
            **{f"{split}_bleu": bleu(translate(work, data, bin_, model, split, threads), split)
               for split in ("valid", "test")}}


def our_side(work: Path, minutes: float, threads: int) -> dict:
    """The quickstart's run in `work` (made when it holds none), its average scored on val and test."""
    if not (work / "average.pt").exists():
        env = {**os.environ, "MINUTES": str(minutes), "WORK": str(work), "THREADS": str(threads)}
        subprocess.run(["bash", "data/quickstart.sh"], cwd=ROOT, env=env, check=True)
    scores = {}
    for split in ("valid", "test"):
        out = work / f"{SPLITS[split]}.bench.de"
        subprocess.run([sys.executable, "-m", "nmt_cli", "translate", "-m", work / "average.pt", "-i",
                        SHARED / "multi30k" / f"{SPLITS[split]}.en", "-o", out, "--beam", "4", "--lenpen", "1.5",
                        "--threads", str(threads)], check=True)
        scores[f"{split}_bleu"] = bleu(out.read_text(encoding="utf-8").splitlines(), split)
    log = [json.loads(line) for line in (work / "ckpt" / "train_log.jsonl").read_text().splitlines()]
    return {"updates": max(r.get("update", 0) for r in log), **scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--fairseq-bin", type=Path, required=True, help="bin/ of the venv holding fairseq")
    parser.add_argument("--minutes", type=float, default=25.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--merges", type=int, default=10000, help="joint BPE merges of the fairseq side")
    parser.add_argument("--ours", type=Path, help="a finished quickstart's WORK (else one is run in --work)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    peer = fairseq_side(args.work / "fairseq", args.fairseq_bin.resolve(), args.minutes, args.threads, args.merges)
    ours = our_side((args.ours or args.work / "nmt").resolve(), args.minutes, args.threads)
    print(json.dumps({"benchmark": "fairseq_quality", "minutes": args.minutes, "threads": args.threads,
                      "fairseq": peer, "nmt": ours}))


if __name__ == "__main__":
    main()
