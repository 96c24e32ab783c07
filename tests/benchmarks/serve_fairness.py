"""How long a small request waits behind a large one in `nmt serve`:
`python tests/benchmarks/serve_fairness.py -m CKPT [--large 400] [--repeats 5]`.

Starts `nmt serve` on loopback (with `--max-tokens` if given), sends one request of `--large`
consecutive lines of the input (default Multi30k test_2016_flickr.en), then, `--delay` seconds
later, a one-sentence request from another client, `--repeats` times, and prints one JSON line:
the large request's latency, the small one's (median and worst), and the server's searches per
large request (how it was cut). The small request's latency alone, on an idle server, is the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import SHARED
from serve_load import post, serving


def searches(url: str) -> int:
    return json.loads(urllib.request.urlopen(url + "/health").read())["searches"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.en")
    parser.add_argument("--large", type=int, default=400, help="sentences of the large request")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds between the large request and the small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, help="the server's (default: its own)")
    args = parser.parse_args()
    args.batch_window_ms = 5.0
    lines = args.input.read_text(encoding="utf-8").splitlines()
    large, small = lines[:args.large], [lines[-1]]
    with serving(args, *([] if args.max_tokens is None else ["--max-tokens", str(args.max_tokens)])) as url:
        alone = statistics.median(post(url + "/translate", small) for _ in range(args.repeats))
        large_s, small_s, cuts = [], [], []
        with ThreadPoolExecutor(2) as pool:
            for _ in range(args.repeats):
                before = searches(url)
                big = pool.submit(post, url + "/translate", large)
                time.sleep(args.delay)
                small_s.append(post(url + "/translate", small))
                large_s.append(big.result())
                cuts.append(searches(url) - before - 1)
        print(json.dumps({
            "benchmark": "serve_fairness", "model": str(args.model), "large_sentences": args.large,
            "threads": args.threads, "max_tokens": args.max_tokens, "delay_s": args.delay, "repeats": args.repeats,
            "small_alone_ms": round(1000 * alone, 1),
            "small_behind_large_ms_median": round(1000 * statistics.median(small_s), 1),
            "small_behind_large_ms_worst": round(1000 * max(small_s), 1),
            "large_ms_median": round(1000 * statistics.median(large_s), 1),
            "searches_per_large_request": statistics.median(cuts),
        }), flush=True)


if __name__ == "__main__":
    main()
