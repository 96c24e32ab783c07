"""What the benchmarks share (imported by the scripts beside it)."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sacrebleu
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.corpus.data import ArrayWriter, IndexedArray, ParallelData
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.search import Hypothesis
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.run_config import RunConfig
from nmt_cli.text.vocab import EOS_ID

SHARED = Path(os.environ.get("NMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))

# CPU kernel paths a benchmark runs a process under: PyTorch's, oneDNN's and MKL's choice of kernels.
KERNEL_PATHS = {"avx512": ("avx512", "AVX512_CORE", "AVX512"), "avx2": ("avx2", "AVX2", "AVX2"),
                "default": ("default", "SSE41", "SSE4_2")}


def kernel_environment(path: str) -> dict[str, str]:
    """os.environ with ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS set to a
    KERNEL_PATHS `path`; on a CPU without AVX-512, avx512 is avx2 (PyTorch obeys avx512 on any CPU,
    and the process then dies of SIGILL)."""
    if path == "avx512" and not getattr(torch.cpu, "_is_avx512_supported", lambda: False)():
        path = "avx2"
    aten, onednn, mkl = KERNEL_PATHS[path]
    return {**os.environ, "ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn, "MKL_ENABLE_INSTRUCTIONS": mkl}


def wmt_like_pairs(directory: Path, pairs: int, vocab: int, seed: int = 0) -> ParallelData:
    """Random sentence pairs of WMT14 en-de's lengths (source: mean 27 tokens, sd 12, clipped to
    4-128; target = source x U(0.8, 1.25)), written as binarized data under `directory`."""
    rng = np.random.default_rng(seed)
    src_len = np.clip(rng.normal(27, 12, pairs), 4, 128).astype(int)
    tgt_len = np.clip(src_len * rng.uniform(0.8, 1.25, pairs), 4, 128).astype(int)
    arrays = []
    for name, lengths in (("src", src_len), ("tgt", tgt_len)):
        writer = ArrayWriter(directory / name, np.dtype(np.int32))
        writer.extend(rng.integers(4, vocab, int(lengths.sum())), lengths)
        writer.close()
        arrays.append(IndexedArray(directory / name, np.dtype(np.int32)))
    return ParallelData(*arrays)


def reference_log_probs(engine: Engine, sources: list[list[int]],
                        refs: list[str]) -> list[tuple[list[int], np.ndarray]]:
    """Per reference: its target ids (BPE, EOS last) and our model's log-probability of each,
    teacher-forced, with no search (Engine.score). A converted model must give the same numbers."""
    targets = [engine.pipeline.target_ids(ref, k + 1, "reference") for k, ref in enumerate(refs)]
    return [(target + [EOS_ID], np.array(scores))
            for target, scores in zip(targets, engine.generator.score(sources, targets))]


class HostWaits:
    """`count`: the calls inside a `counting()` block that made the host wait for the CUDA device
    (torch.cuda.set_sync_debug_mode warns at each); 0 off CUDA."""

    def __init__(self) -> None:
        self.count = 0

    @classmethod
    @contextlib.contextmanager
    def counting(cls, cuda: bool) -> Iterator[HostWaits]:
        waits = cls()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                yield waits
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        waits.count = sum("synchroniz" in str(w.message) for w in caught)


def timed(engine: Engine, sources: list[list[int]]) -> tuple[float, int, list[list[Hypothesis]]]:
    """Seconds, host waits (on a GPU) and hypotheses of translating `sources`. On a GPU the first
    64 are translated once before, untimed: CUDA's and the search's first-use costs (and graph
    captures) are not the search's speed."""
    cuda = engine.device.type == "cuda"
    if cuda:
        engine.generator.search(sources[:64], engine.config.search)
        torch.cuda.synchronize()
    start = time.perf_counter()
    with HostWaits.counting(cuda) as waits:
        hyps = engine.generator.search(sources, engine.config.search)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, waits.count, hyps


def decoding_arguments(description: str | None) -> argparse.ArgumentParser:
    """The options of the decoding side-by-sides: model, input and references, search, threads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.en")
    parser.add_argument("--ref", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.de")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shortlist", type=Path, help="a shortlist of `nmt shortlist` (CTranslate2: a vocabulary map)")
    return parser


@dataclass
class OurSide:
    """Our checkpoint and engine (CPU, `--threads`), the input encoded to ids, the references."""

    bundle: ModelBundle
    engine: Engine
    lines: list[str]
    sources: list[list[int]]
    refs: list[str]

    @classmethod
    def load(cls, args: argparse.Namespace) -> OurSide:
        torch.set_num_threads(args.threads)
        bundle = load_bundle(args.model)
        options = RunConfig(SearchConfig(beam=args.beam, lenpen=args.lenpen), max_tokens=args.max_tokens)
        engine = Engine([bundle], options, torch.device("cpu"))
        lines = args.input.read_text(encoding="utf-8").splitlines()
        sources = [engine.pipeline.source_ids(line, i + 1) for i, line in enumerate(lines)]
        return cls(bundle, engine, lines, sources, args.ref.read_text(encoding="utf-8").splitlines())

    def figures(self, seconds: float, tokens: int, outputs: list[str]) -> dict:
        """Speed in decode_speed.py's terms (tokens: BPE tokens + EOS) and the sacreBLEU of `outputs`."""
        return {"seconds": round(seconds, 2), "sentences_per_s": round(len(self.lines) / seconds, 1),
                "target_tokens_per_s": round(tokens / seconds, 1),
                "bleu": round(sacrebleu.corpus_bleu(outputs, [self.refs]).score, 2)}
