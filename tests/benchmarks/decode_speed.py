"""Decoding speed: `python tests/benchmarks/decode_speed.py -m CKPT [-i test.en] [--beam 4] [--quantize int8]`.

Translates the input (default: Multi30k test_2016_flickr.en, 1,000 sentences) with the library's
Translator, timing the translation only (model loading excluded), and prints one JSON line:
sentences/s, target tokens/s (BPE tokens + EOS, as fairseq counts), peak RSS; with `--ref`, the
sacreBLEU of the output too.
"""

from __future__ import annotations

import json
import resource
import time

import torch
from common import decoding_arguments

from nmt_cli.checkpoint import load_bundle
from nmt_cli.config import SearchConfig, TranslateConfig
from nmt_cli.device import select
from nmt_cli.translate import Translator


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.set_defaults(ref=None)  # BLEU only when asked for
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quantize", choices=["int8"], default=None)
    args = parser.parse_args()
    device, _ = select(args.device, "fp32", args.threads)  # threads and memory settings as `nmt translate`'s
    lines = args.input.read_text(encoding="utf-8").splitlines()
    options = TranslateConfig(SearchConfig(beam=args.beam, lenpen=args.lenpen), max_tokens=args.max_tokens,
                               quantize=args.quantize)
    translator = Translator([load_bundle(args.model)], options, device)
    start = time.perf_counter()
    sources = [translator.encode(line, i + 1) for i, line in enumerate(lines)]
    hyps = translator.translate_ids(sources)
    outputs = [translator.detokenize(h[0].tokens) if h else "" for h in hyps]
    seconds = time.perf_counter() - start
    tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
    result = {"benchmark": "decode_speed", "model": str(args.model), "sentences": len(lines), "beam": args.beam,
              "quantize": args.quantize,
              "threads": torch.get_num_threads(), "seconds": round(seconds, 2),
              "sentences_per_s": round(len(lines) / seconds, 1), "target_tokens_per_s": round(tokens / seconds, 1),
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    if args.ref:
        import sacrebleu

        refs = args.ref.read_text(encoding="utf-8").splitlines()
        result["bleu"] = round(sacrebleu.corpus_bleu(outputs, [refs]).score, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
