"""fairseq side by side: `python tests/benchmarks/fairseq_train_speed.py DATA_DIR --fairseq-bin VENV/bin`.

Trains fairseq's transformer on the very data of an `nmt preprocess` directory (its BPE sentences
and joint dictionary exported as text, binarized by fairseq-preprocess), with the architecture of
our `small` preset (3+3 layers, d_model 256, d_ff 1024, 4 heads, all embeddings shared), the
paper's optimizer and label smoothing, `--max-tokens` 4096 and 2 threads, and prints one JSON line
in train_speed.py's terms: target tokens/s (fairseq's `wps`, averaged over the logged intervals
after the first), updates/s and target tokens per update. Run it next to train_speed.py on the
same DATA_DIR, on an idle machine. Also reported: the seconds fairseq-preprocess takes to
binarize the exported train and valid BPE text (--workers = threads).

fairseq is not a dependency of nmt-cli. fairseq 0.12.2 on Python 3.11 needs three workarounds
(install it in a separate virtual environment with torch==2.13.0, cython, "numpy<2" and "pip<24.1"):
its sdist lists C++ sources it does not ship (remove the `fairseq.libbase` and `fairseq.libnat`
extensions from setup.py, then `pip install --no-build-isolation .`), and its hydra/fairseq
dataclasses use instances as field defaults, which Python 3.11 rejects; a `sitecustomize.py` in
that environment that gives such default classes an identity hash lets it import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from nmt_cli.corpus.data import IndexedArray
from nmt_cli.corpus.datadir import DataDir
from nmt_cli.text.vocab import Vocabulary


def export_text(data_dir: Path, out: Path, split: str, lang: str, vocab: Vocabulary, dtype: np.dtype) -> None:
    array = IndexedArray(data_dir / f"{split}.{lang}", dtype)
    with open(out / f"{split}.{lang}", "w", encoding="utf-8") as f:
        for i in range(len(array)):
            f.write(" ".join(vocab.decode(array[i].tolist())) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--fairseq-bin", type=Path, required=True, help="bin/ of the venv holding fairseq")
    parser.add_argument("--updates", type=int, default=35)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    meta = DataDir.open(args.data_dir).meta
    src, tgt = meta["text"]["source_lang"], meta["text"]["target_lang"]
    dtype = np.dtype(meta["dtype"])
    vocab = Vocabulary.load(args.data_dir / meta["dictionaries"][src])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    with tempfile.TemporaryDirectory() as work:
        text, binary = Path(work) / "text", Path(work) / "bin"
        text.mkdir()
        for split in ("train", "valid"):
            for lang in (src, tgt):
                export_text(args.data_dir, text, split, lang, vocab, dtype)
        start = time.perf_counter()
        subprocess.run([args.fairseq_bin / "fairseq-preprocess", "-s", src, "-t", tgt,
                        "--trainpref", text / "train", "--validpref", text / "valid", "--destdir", binary,
                        "--joined-dictionary", "--srcdict", args.data_dir / meta["dictionaries"][src],
                        "--workers", str(args.threads)], check=True, env=env, capture_output=True)
        binarize_s = time.perf_counter() - start
        log = subprocess.run([
            args.fairseq_bin / "fairseq-train", binary, "--cpu", "--arch", "transformer",
            "--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
            "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
            "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings",
            "--dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
            "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", str(args.max_tokens), "--max-update", str(args.updates),
            "--log-interval", str(args.log_interval), "--log-format", "simple", "--disable-validation",
            "--no-save", "--seed", "1", "--num-workers", "0",
        ], check=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    intervals = [dict(re.findall(r"(\w+)=([\d.]+)", line)) for line in log.splitlines() if "train_inner" in line]
    timed = intervals[1:]  # the first interval includes start-up
    wps = sum(float(i["wps"]) for i in timed) / len(timed)
    ups = sum(float(i["ups"]) for i in timed) / len(timed)
    print(json.dumps({
        "benchmark": "fairseq_train_speed", "fairseq": "0.12.2", "max_tokens": args.max_tokens,
        "threads": args.threads, "updates": args.updates, "intervals": len(timed),
        "target_tokens_per_s": round(wps, 1), "updates_per_s": round(ups, 3),
        "target_tokens_per_update": round(wps / ups),
        "fairseq_preprocess_train_valid_s": round(binarize_s, 2),
    }))


if __name__ == "__main__":
    main()
