"""How exactly `nmt import` reproduces transformers' MarianMTModel: `python
tests/benchmarks/import_exactness.py --work DIR [--lines 1000] [--beam-lines 300]`.

1. OPUS-MT en-mg's released configuration and tokenizer files (../shared/data) with random weights
   at a smaller size (tests/conftest.py's `opus_mt_release`), as released and in a tc-big-like
   layout (</s> at 44670, untied output, unscaled embeddings, GELU): token ids against
   MarianTokenizer on the first `--lines` lines of Multi30k's train.en, the largest logit
   difference on 16 teacher-forced pairs, greedy translations against generate(num_beams=1) on
   `--lines` lines of val.en (22 tokens and the forced </s>).
2. Beam search needs a model that ends its sentences: a tiny SentencePiece model trained for
   `--updates` (400) updates to copy letters (tests/conftest.py's `exported` recipe), exported to transformers with
   the generation settings of a release (beam 4, length penalty 1.0, early_stopping False) and
   imported; our search with the imported defaults against generate() on `--beam-lines` lines.
One JSON line with the counts and the largest difference.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from common import SHARED

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/conftest.py's helpers

from conftest import opus_mt_release, synthetic_pairs, write_lines  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianTokenizer  # noqa: E402

from nmt_cli.cli import main as nmt  # noqa: E402
from nmt_cli.config import TrainConfig  # noqa: E402
from nmt_cli.decode.translator import Translator  # noqa: E402
from nmt_cli.interop.importer import import_model  # noqa: E402
from nmt_cli.model.architecture import PRESETS  # noqa: E402
from nmt_cli.text.vocab import BOS_ID, EOS_ID  # noqa: E402
from nmt_cli.train.run import TrainingRun  # noqa: E402

LAYOUTS = {"en-mg": {}, "tc-big-like": {"eos": 44670, "tie_word_embeddings": False, "scale_embedding": False,
                                        "activation_function": "gelu"}}


def released_ids(tokenizer, vocab, ids: list[int]) -> list[int]:
    return [tokenizer.encoder["<pad>"] if i == BOS_ID else tokenizer.encoder[vocab.tokens[i]] for i in ids]


def layout(work: Path, changes: dict, lines: int) -> dict:
    model = opus_mt_release(work / "hf", **changes)
    import_model(work / "hf", work / "imported.pt")
    tokenizer = MarianTokenizer.from_pretrained(str(work / "hf"))
    translator = Translator.load(work / "imported.pt", device="cpu")
    pipeline = translator.engine.pipeline
    english = (SHARED / "multi30k/train.en").read_text(encoding="utf-8").splitlines()[:lines]
    ours = [released_ids(tokenizer, pipeline.src_vocab, pipeline.source_ids(line, k) + [EOS_ID])
            for k, line in enumerate(english)]
    ids_equal = sum(a == b for a, b in zip(ours, tokenizer(english)["input_ids"]))
    german = (SHARED / "multi30k/train.de").read_text(encoding="utf-8").splitlines()[:16]
    batch = tokenizer(english[:16], text_target=german, return_tensors="pt", padding=True)
    src = [pipeline.source_ids(line, k) + [EOS_ID] for k, line in enumerate(english[:16])]
    tgt = [[BOS_ID] + pipeline.target_ids(line, k, "reference") for k, line in enumerate(german)]
    difference = 0.0
    with torch.no_grad():
        for s, t in zip(src, tgt):
            decoder = torch.tensor([released_ids(tokenizer, pipeline.tgt_vocab, t)])
            theirs = model(input_ids=torch.tensor([released_ids(tokenizer, pipeline.src_vocab, s)]),
                           decoder_input_ids=decoder).logits[0]
            mine = translator.engine.generator.models.models[0](torch.tensor([s]), torch.tensor([t]))[0]
            columns = released_ids(tokenizer, pipeline.tgt_vocab, list(range(1, len(pipeline.tgt_vocab))))
            difference = max(difference, (mine[:, 1:] - theirs[:, columns]).abs().max().item())
    val = (SHARED / "multi30k/val.en").read_text(encoding="utf-8").splitlines()[:lines]
    generated = []
    for start in range(0, len(val), 100):
        batch = tokenizer(val[start:start + 100], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, num_beams=1, max_length=24, bad_words_ids=[[tokenizer.pad_token_id]])
        generated += [[i for i in row.tolist()[1:] if i != tokenizer.pad_token_id] for row in out]
    _, found = translator.engine.search(val, translator.search_config(beam=1, max_len_b=22))
    greedy = [released_ids(tokenizer, pipeline.tgt_vocab, h[0].tokens + [EOS_ID]) for h in found]
    return {"ids_equal": ids_equal, "lines": len(english), "max_logit_difference": difference,
            "greedy_equal": sum(a == b for a, b in zip(greedy, generated)), "greedy_lines": len(val)}


def trained_release(work: Path, updates: int) -> tuple[Path, Path]:
    raw = work / "raw"
    raw.mkdir(parents=True)
    for split, n, seed in (("train", 400, 0), ("valid", 40, 1000)):
        pairs = synthetic_pairs(n, seed, "copy")
        write_lines(raw / f"{split}.src", [s for s, _ in pairs])
        write_lines(raw / f"{split}.tgt", [t for _, t in pairs])
    nmt(["preprocess", "-s", "src", "-t", "tgt", "--trainpref", str(raw / "train"), "--validpref",
         str(raw / "valid"), "--destdir", str(work / "data"), "--subword", "sentencepiece", "--vocab-size", "40",
         "--quiet", "--workers", "1"], standalone_mode=False)
    model = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
                                     max_positions=64)
    config = TrainConfig(max_tokens=400, lr_schedule="inverse-sqrt", lr=3e-3, warmup=30, max_updates=updates,
                         device="cpu", threads=1, save_interval_minutes=1000.0)
    TrainingRun(work / "data", work / "ck", model, config, progress_bar=False).run()
    nmt(["export", "-m", str(work / "ck/checkpoint_last.pt"), "--format", "transformers", "-o", str(work / "hf")],
        standalone_mode=False)
    generation = json.loads((work / "hf/generation_config.json").read_text())
    generation.update(num_beams=4, length_penalty=1.0, early_stopping=False)
    (work / "hf/generation_config.json").write_text(json.dumps(generation))
    import_model(work / "hf", work / "imported.pt")
    return work / "hf", work / "imported.pt"


def beam(work: Path, lines: int, updates: int) -> dict:
    directory, imported = trained_release(work, updates)
    sources = [s for s, _ in synthetic_pairs(lines, 77, min_len=6, max_len=14)]
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(directory)).eval()
    theirs = []
    for start in range(0, len(sources), 100):
        batch = tokenizer(sources[start:start + 100], return_tensors="pt", padding=True)
        with torch.no_grad():
            theirs += tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
    ours = Translator.load(imported, device="cpu").translate(sources)
    early = Translator.load(imported, device="cpu", stopping="early").translate(sources)
    return {"beam_equal": sum(a == b for a, b in zip(ours, theirs)), "beam_lines": len(sources),
            "beam_equal_with_our_early_stopping": sum(a == b for a, b in zip(early, theirs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--beam-lines", type=int, default=300)
    parser.add_argument("--updates", type=int, default=400, help="the beam search's model's training")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    result: dict = {"benchmark": "import_exactness", "torch": torch.__version__}
    for name, changes in LAYOUTS.items():
        result[name] = layout(args.work / name, changes, args.lines)
    result.update(beam(args.work / "beam", args.beam_lines, args.updates))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
