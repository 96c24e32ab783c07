"""Token ids in, hypotheses out: one model or an ensemble on a device, searching batches of
sources grouped by length within a token budget (search.py's beam search or sampling). A batch
the device has no memory for is searched in halves (warned once). `nmt translate`, `nmt serve`,
validation and the Python API all search through a Generator; text is translate.py's business."""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from nmt_cli import NmtError, kernels
from nmt_cli.config import SearchConfig
from nmt_cli.data import pad
from nmt_cli.device import out_of_memory
from nmt_cli.model import Transformer
from nmt_cli.search import Ensemble, Hypothesis, beam_search, sample
from nmt_cli.vocab import EOS_ID


class Generator:
    """`models` (moved to `device` in `dtype`, int8 with `quantize`) searching batches of at most
    `max_tokens` source tokens and `batch_size` sentences; `never` are target ids no search
    outputs (vocabulary fillers); with `graphs`, beam search replays CUDA graphs; `seed` seeds
    sampling (None: a random seed, said through `warn` when the first sample is drawn)."""

    def __init__(self, models: Sequence[Transformer], device: torch.device, dtype: torch.dtype = torch.float32, *,
                 max_tokens: int, batch_size: int | None = None, never: Sequence[int] = (), graphs: bool = False,
                 quantize: str | None = None, seed: int | None = None,
                 warn: Callable[[str], None] = print) -> None:
        if graphs and device.type != "cuda":
            raise NmtError(f"--cuda-graphs needs a CUDA device, not {device.type}")
        models = [model.to(device=device, dtype=dtype) for model in models]
        if quantize == "int8":
            for model in models:
                quantize_int8(model, device, dtype)
        self.device, self.max_tokens, self.batch_size, self.warn = device, max_tokens, batch_size, warn
        self.models = Ensemble(models, graphs=graphs, never=never)
        self.rng = torch.Generator(device)
        self.seed = seed
        if seed is not None:
            self.rng.manual_seed(seed)
        self.halved = False  # a batch was split after running out of memory (warned once)

    def search(self, sources: list[list[int]], config: SearchConfig,
               prefixes: list[list[int]] | None = None) -> list[list[Hypothesis]]:
        """The hypotheses of each source (an empty source has none), each output starting with its
        prefix when given, in the order of `sources`."""
        if config.sampling and self.seed is None:
            self.seed = secrets.randbelow(2**31)
            self.rng.manual_seed(self.seed)
            self.warn(f"sampling with --seed {self.seed} (the same seed, input and batch options repeat these samples)")
        results: list[list[Hypothesis]] = [[] for _ in sources]
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        for batch in batches(order, sources, self.max_tokens, self.batch_size):
            for i, hyps in zip(batch, self._fitting(batch, sources, prefixes, config)):
                results[i] = hyps
        return results

    def _fitting(self, batch: list[int], sources: list[list[int]], prefixes: list[list[int]] | None,
                 config: SearchConfig) -> list[list[Hypothesis]]:
        """The hypotheses of `batch`; where the device runs out of memory, those of its two halves."""
        try:
            return self._batch(batch, sources, prefixes, config)
        except RuntimeError as e:  # CUDA's OutOfMemoryError is one
            if not out_of_memory(e):
                raise
            cuda = isinstance(e, torch.cuda.OutOfMemoryError)
            what = "CUDA out of memory" if cuda else "out of memory"
            if len(batch) == 1:
                raise NmtError(f"{what} translating a single sentence of {len(sources[batch[0]])} tokens; use a "
                               f"smaller --beam{' or --device cpu' if cuda else ''}") from None
        self.models.release_graphs()  # their padded caches are the largest buffers kept
        if cuda:
            torch.cuda.empty_cache()
        if not self.halved:
            self.warn(f"warning: {what} for {len(batch)} sentences at once: translating such batches "
                      "in halves (a smaller --max-tokens avoids the retries)")
            self.halved = True
        half = len(batch) // 2
        return [hyps for part in (batch[:half], batch[half:])
                for hyps in self._fitting(part, sources, prefixes, config)]

    def _batch(self, batch: list[int], sources: list[list[int]], prefixes: list[list[int]] | None,
               config: SearchConfig) -> list[list[Hypothesis]]:
        src = pad([np.array(sources[i] + [EOS_ID]) for i in batch]).to(self.device)
        forced = None
        if prefixes is not None and any(prefixes[i] for i in batch):
            forced = pad([np.array(prefixes[i], dtype=np.int64) for i in batch], value=-1).to(self.device)
        if config.sampling:
            return sample(self.models, src, config, self.rng, forced)
        return beam_search(self.models, src, config, forced)


def batches(order: list[int], sources: list[list[int]], max_tokens: int, batch_size: int | None) -> Iterator[list[int]]:
    """Consecutive runs of the length-sorted `order` within `max_tokens` (padded) and `batch_size`."""
    batch: list[int] = []
    for i in order:
        width = len(sources[i]) + 1
        too_many = batch_size is not None and len(batch) >= batch_size
        if batch and (too_many or (len(batch) + 1) * width > max_tokens):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def quantize_int8(model: Transformer, device: torch.device, dtype: torch.dtype) -> None:
    """`--quantize int8`: see kernels.quantize_int8; CPU and float32 only."""
    if device.type != "cpu" or dtype != torch.float32:
        raise NmtError(f"--quantize int8 runs on the CPU in fp32 (add --device cpu), not on {device.type} "
                       f"in {str(dtype).removeprefix('torch.')}")
    try:
        with warnings.catch_warnings():  # torch >= 2.10 warns that torch.ao moves to torchao
            warnings.simplefilter("ignore")
            kernels.quantize_int8(model)
    except (ImportError, RuntimeError) as e:
        raise NmtError(f"--quantize int8: this PyTorch cannot quantize on this CPU ({e})") from None
