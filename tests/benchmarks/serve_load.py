"""Load test of `nmt serve`: `python tests/benchmarks/serve_load.py -m CKPT [--clients 1 8 32] [--requests 200]`.

Starts `nmt serve` on loopback, then for each number of concurrent clients sends `--requests`
POST /translate requests of `--sentences` consecutive lines of the input (default Multi30k
test_2016_flickr.en) with a real HTTP client (urllib, one thread per client), and prints one JSON
line per level: requests/s, sentences/s, p50/p99 latency, the server's searches per request (how
much it batched), and the ratio of its sentences/s to translating the same sentences in one
`nmt translate`-style call (translate.translate_lines, in this process, same threads). Bounded:
it stops after the requests. Server and clients share the machine's cores. `--guarded`: the server
with an API key, a CORS origin, a rate limit and an access log (what they cost).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from common import SHARED

from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.translate import translate_lines
from nmt_cli.device import tune
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.run_config import RunConfig


def post(url: str, lines: list[str], headers: dict[str, str] | None = None) -> float:
    """The seconds a translation request takes (`headers`: an API key, an Origin)."""
    start = time.perf_counter()
    data = json.dumps({"text": lines}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {}), timeout=600) as response:
        assert response.status == 200 and len(json.loads(response.read())["translations"]) == len(lines)
    return time.perf_counter() - start


@contextlib.contextmanager
def serving(args: argparse.Namespace, *options: str) -> Iterator[str]:
    """`nmt serve` of args.model with `options` on a free port: its URL, until the block ends."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "nmt_cli", "serve", "-m", str(args.model), "--port", str(port),
                                "--device", "cpu", "--threads", str(args.threads),
                                "--batch-window-ms", str(args.batch_window_ms), *options], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("nmt serve did not start")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.en")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--sentences", type=int, default=1, help="sentences per request")
    parser.add_argument("--batch-window-ms", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--guarded", action="store_true", help="the server with an API key, a CORS origin, a rate "
                        "limit it never reaches and an access log; the clients send the key and an Origin")
    args = parser.parse_args()
    lines = args.input.read_text(encoding="utf-8").splitlines()
    bodies = [[lines[(k * args.sentences + j) % len(lines)] for j in range(args.sentences)]
              for k in range(args.requests)]
    device = torch.device("cpu")
    tune(device, args.threads)
    engine = Engine([load_bundle(args.model)], RunConfig(SearchConfig()), device)
    start = time.perf_counter()
    translate_lines(engine, [line for body in bodies for line in body])
    file_rate = args.requests * args.sentences / (time.perf_counter() - start)
    del engine
    torch.set_num_threads(1)  # the clients need little; the server has its own threads
    options, headers = [], {}
    if args.guarded:
        keys = Path(tempfile.mkdtemp()) / "keys.txt"
        keys.write_text("benchmark\n")
        options = ["--api-keys", str(keys), "--cors-origin", "https://app.example", "--rate-limit", "1000000",
                   "--access-log"]
        headers = {"Authorization": "Bearer benchmark", "Origin": "https://app.example"}
    with serving(args, *options) as url:
        for clients in args.clients:
            before = json.loads(urllib.request.urlopen(url + "/health").read())
            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                latencies = list(pool.map(lambda body: post(url + "/translate", body, headers), bodies))
            seconds = time.perf_counter() - start
            after = json.loads(urllib.request.urlopen(url + "/health").read())
            rate = args.requests * args.sentences / seconds
            print(json.dumps({
                "benchmark": "serve_load", "model": str(args.model), "clients": clients, "requests": args.requests,
                "sentences_per_request": args.sentences, "threads": args.threads, "guarded": args.guarded,
                "requests_per_s": round(args.requests / seconds, 1), "sentences_per_s": round(rate, 1),
                "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
                "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 1),
                "searches_per_request": round((after["searches"] - before["searches"]) / args.requests, 3),
                "translate_sentences_per_s": round(file_rate, 1), "ratio_to_translate": round(rate / file_rate, 3),
            }), flush=True)


if __name__ == "__main__":
    main()
