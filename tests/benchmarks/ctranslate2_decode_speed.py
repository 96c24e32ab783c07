"""CTranslate2 side by side: `python tests/benchmarks/ctranslate2_decode_speed.py -m CKPT [--compute-type float32]
[--shortlist FILE]` (with a shortlist: exported as its vocabulary map, and `use_vmap=True`).

Converts one of our checkpoints into a CTranslate2 model as `nmt export --format ctranslate2`
does (same weights, our position table, decoding starts from <s>), checks that
both give the same scores for the reference translations, then translates the same input as
decode_speed.py (Multi30k test_2016_flickr.en, beam 4, 2 threads, batches of 8,000 source
tokens) and prints one JSON line in decode_speed.py's terms: sentences/s, target tokens/s (BPE
tokens + EOS), BLEU. Run it next to decode_speed.py with the same checkpoint, on an idle machine.

CTranslate2 is not a dependency of nmt-cli: `pip install ctranslate2` (4.8.5 here). Its length
penalty divides by length^alpha where ours is GNMT's ((5 + length) / 6)^alpha, so outputs can differ
a little; the score check runs on the references, with no search involved.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import ctranslate2
import numpy as np
from common import OurSide, decoding_arguments, reference_log_probs

from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.interop.export_ctranslate2 import save_ctranslate2


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.add_argument("--compute-type", default="float32", choices=["float32", "int8", "int8_float32"])
    args = parser.parse_args()
    ours = OurSide.load(args)
    source_tokens = [ours.bundle.src_vocab.decode(s) for s in ours.sources]
    references = reference_log_probs(ours.engine, ours.sources[:50], ours.refs[:50])
    with tempfile.TemporaryDirectory() as work:
        shortlist = args.shortlist and Shortlist.load(args.shortlist, ours.bundle)
        save_ctranslate2(ours.bundle, Path(work) / "ct2", shortlist=shortlist)  # what `nmt export` writes
        translator = ctranslate2.Translator(str(Path(work) / "ct2"), device="cpu", compute_type=args.compute_type,
                                            intra_threads=args.threads, inter_threads=1)
        # same model? score the references with CTranslate2 too (it adds the EOS itself)
        targets = [ours.bundle.tgt_vocab.decode(target[:-1]) for target, _ in references]
        scores = translator.score_batch(source_tokens[:50], targets)
        diffs = [float(np.abs(mine - np.array(theirs.log_probs)).max())
                 for (_, mine), theirs in zip(references, scores)]
        start = time.perf_counter()
        results = translator.translate_batch(source_tokens, beam_size=args.beam, length_penalty=args.lenpen,
                                             max_batch_size=args.max_tokens, batch_type="tokens",
                                             use_vmap=shortlist is not None,
                                             max_decoding_length=min(256, ours.bundle.model.config.max_positions - 1))
        seconds = time.perf_counter() - start
    hyps = [r.hypotheses[0] for r in results]
    outputs = [ours.engine.pipeline.target.decode(h) for h in hyps]
    print(json.dumps({
        "benchmark": "ctranslate2_decode_speed", "ctranslate2": ctranslate2.__version__,
        "compute_type": args.compute_type, "shortlist": args.shortlist and str(args.shortlist),
        "model": str(args.model), "sentences": len(ours.lines), "beam": args.beam,
        "threads": args.threads, "max_token_logprob_difference": round(max(diffs), 5),
        **ours.figures(seconds, sum(len(h) + 1 for h in hyps), outputs),
    }))


if __name__ == "__main__":
    main()
