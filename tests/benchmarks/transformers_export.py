"""`nmt export --format transformers` side by side:
`python tests/benchmarks/transformers_export.py -m CKPT [--beam 4 --lenpen 0.6] [--ct2-converter]`.

Exports a SentencePiece checkpoint as `nmt export --format transformers` does, loads it with
AutoModelForSeq2SeqLM / AutoTokenizer, and on Multi30k test_2016_flickr.en (by default) prints one
JSON line:
- the largest difference of the teacher-forced logits of the first 50 references;
- greedy search: how many lines `generate` gives exactly as nmt-cli does;
- beam search without a length penalty (both rank by log-probability): how many agree;
- beam search with the length penalty alpha (`--lenpen`; ours divides by ((5 + |Y|) / 6)^alpha,
  transformers by |Y|^alpha): how many agree, and the sacreBLEU of each;
- with `--ct2-converter`: what CTranslate2's `ct2-transformers-converter` says of the directory.
Both sides run on the CPU in batches of `--batch` sentences.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import sacrebleu
import torch
from common import OurSide, decoding_arguments
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from nmt_cli.config import SearchConfig
from nmt_cli.interop.export_transformers import save_transformers
from nmt_cli.model.checkpoint import load
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID


def padded(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor([row + [PAD_ID] * (max(map(len, rows)) - len(row)) for row in rows])


def logit_difference(ours: OurSide, tokenizer, model, count: int = 50) -> float:
    """Largest |difference| of the two models' logits on the first `count` (source, reference) pairs."""
    sources, refs = ours.lines[:count], ours.refs[:count]
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    tgt = [ours.engine.pipeline.target_ids(r, k + 1, "reference") + [EOS_ID] for k, r in enumerate(refs)]
    tgt_in = padded([[BOS_ID] + row[:-1] for row in tgt])
    with torch.no_grad():
        mine = ours.bundle.model(padded([s + [EOS_ID] for s in ours.sources[:count]]), tgt_in)
        theirs = model(**batch, decoder_input_ids=tgt_in).logits
    real = tgt_in != PAD_ID
    return (mine[real] - theirs[real]).abs().max().item()


def ours_translated(ours: OurSide, beam: int, lenpen: float) -> list[str]:
    # as `nmt translate` with --max-len-a 0 --max-len-b (a large number): the limit is the model's positions,
    # as for `generate` (max_length)
    search = SearchConfig(beam=beam, lenpen=lenpen, max_len_a=0, max_len_b=100_000)
    hyps = ours.engine.generator.search(ours.sources, search)
    return [ours.engine.pipeline.text(h[0].tokens) if h else "" for h in hyps]


def generated(tokenizer, model, lines: list[str], batch: int, **kwargs) -> list[str]:
    out = []
    for start in range(0, len(lines), batch):
        inputs = tokenizer(lines[start:start + batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            out += tokenizer.batch_decode(model.generate(**inputs, **kwargs), skip_special_tokens=True)
    return out


def converter_says(directory: Path, work: Path) -> str:
    done = subprocess.run([str(Path(sys.executable).parent / "ct2-transformers-converter"), "--model",
                           str(directory), "--output_dir", str(work / "ct2")], capture_output=True, text=True)
    return "converted" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ct2-converter", action="store_true")
    args = parser.parse_args()
    ours = OurSide.load(args)
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work) / "hf"
        save_transformers(load(args.model), args.model, directory)
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForSeq2SeqLM.from_pretrained(str(directory)).eval()
        result = {"benchmark": "transformers_export", "sentences": len(ours.lines),
                  "max_logit_difference": logit_difference(ours, tokenizer, model)}
        for name, beam, lenpen in (("greedy", 1, 0.0), ("beam_no_lenpen", args.beam, 0.0),
                                   ("beam_lenpen", args.beam, args.lenpen)):
            mine = ours_translated(ours, beam, lenpen)
            theirs = generated(tokenizer, model, ours.lines, args.batch, num_beams=beam, length_penalty=lenpen)
            result[name] = {"beam": beam, "lenpen": lenpen, "same_lines": sum(a == b for a, b in zip(mine, theirs)),
                            "bleu_nmt": round(sacrebleu.corpus_bleu(mine, [ours.refs]).score, 2),
                            "bleu_transformers": round(sacrebleu.corpus_bleu(theirs, [ours.refs]).score, 2)}
        if args.ct2_converter:
            result["ct2_transformers_converter"] = converter_says(directory, Path(work))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
