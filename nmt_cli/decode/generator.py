"""Token ids in, hypotheses (or scores) out: one model or an ensemble on a device, with its fast
paths, searching batches of sources grouped by length within a token budget (search.py's beam
search or sampling), or scoring given targets. A batch the device has no memory for is run in
halves (warned once). `nmt translate`, `nmt serve`, validation and the Python API all run
through a Generator; text is pipeline.py's business."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import secrets
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.corpus.data import pad
from nmt_cli.decode.constraints import Phrases, Terms, holds
from nmt_cli.decode.ensemble import Ensemble, averaged
from nmt_cli.decode.sampling import sample
from nmt_cli.decode.search import Hypothesis, beam_search
from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.device import out_of_memory
from nmt_cli.errors import NmtError
from nmt_cli.model import kernels
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID


class Generator:
    """`models` (moved to `device` in `dtype`, int8 with `quantize`) searching batches of at most
    `max_tokens` source tokens and `batch_size` sentences; `never` are target ids no search
    outputs (vocabulary fillers); `joining` are those that go on into the next token's word (BPE's
    @@: a constraint begins where a word does); with `graphs`, beam search replays CUDA graphs;
    `seed` seeds sampling (None: a random seed, said through `warn` when the first sample is drawn);
    with a `shortlist`, each batch outputs only the target tokens it lists for the batch."""

    def __init__(self, models: Sequence[Transformer], device: torch.device, dtype: torch.dtype = torch.float32, *,
                 max_tokens: int, batch_size: int | None = None, never: Sequence[int] = (),
                 joining: Sequence[int] = (), graphs: bool = False, quantize: str | None = None,
                 seed: int | None = None, shortlist: Shortlist | None = None,
                 warn: Callable[[str], None] = print) -> None:
        if graphs and device.type != "cuda":
            raise NmtError(f"--cuda-graphs needs a CUDA device, not {device.type}")
        models = [kernels.use_fast_paths(model.to(device=device, dtype=dtype)) for model in models]
        if quantize == "int8":
            for model in models:
                kernels.quantize_int8(model, device, dtype)
        self.device, self.max_tokens, self.batch_size, self.warn = device, max_tokens, batch_size, warn
        self.shortlist = shortlist
        self.models = Ensemble(models, graphs=graphs, never=never)
        self.joining = torch.zeros(self.models.vocab_size, dtype=torch.bool, device=device)
        self.joining[list(joining)] = True
        self.joining_on_host = self.joining.cpu()  # read per output line
        self.rng = torch.Generator(device)
        self.seed = seed
        if seed is not None:
            self.rng.manual_seed(seed)
        self.halved = False  # a batch was split after running out of memory (warned once)

    def stream(self, seed: int) -> torch.Generator:
        """A random stream of its own, started from `seed`: a call's samples, whatever other calls
        draw meanwhile (from other threads, say)."""
        return torch.Generator(self.device).manual_seed(seed)

    def search(self, sources: list[list[int]], config: SearchConfig, prefixes: list[list[int]] | None = None,
               rng: torch.Generator | None = None, terms: Phrases | None = None) -> list[list[Hypothesis]]:
        """The hypotheses of each source (an empty source has none), each output starting with its
        prefix when given and holding its `terms` (constraints.py), in the order of `sources`.
        Samples are drawn from `rng` (a call's own `stream`), else continue the random stream
        seeded at construction."""
        if terms is not None and config.plain_first:
            return self._plain_first(sources, config, prefixes, terms)
        if config.sampling and rng is None and self.seed is None:
            self.seed = secrets.randbelow(2**31)
            self.rng.manual_seed(self.seed)
            self.warn(f"sampling with --seed {self.seed} (the same seed, input and batch options repeat these samples)")
        widths = [width(s) for s in sources]
        order = sorted((i for i, s in enumerate(sources) if s), key=widths.__getitem__)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for batch in batches(order, widths, self.max_tokens, self.batch_size):
            run = functools.partial(self._search, sources=sources, prefixes=prefixes, config=config, terms=terms,
                                    rng=self.rng if rng is None else rng)
            for i, hyps in zip(batch, self._fitting(batch, run, lambda i: f"a single sentence of {widths[i] - 1} "
                                                                          "tokens")):
                results[i] = hyps
        return results

    def holds(self, output: list[int], include: Sequence[Sequence[int]], avoid: Sequence[Sequence[int]] = ()) -> bool:
        """constraints.holds, with the joining tokens of this generator's vocabulary."""
        return holds(output, include, avoid, self.joining_on_host)

    def _plain_first(self, sources: list[list[int]], config: SearchConfig, prefixes: list[list[int]] | None,
                     terms: Phrases) -> list[list[Hypothesis]]:
        """--plain-first: each source's plain hypotheses where the best already holds its `terms`
        (constraints.holds), the others' searched again with them."""
        found = self.search(sources, config, prefixes)
        again = [i for i, hyps in enumerate(found) if hyps and not self.holds(hyps[0].tokens, terms[0][i], terms[1][i])]
        if again:
            def only(rows: list) -> list:
                return [rows[i] for i in again]

            redone = self.search(only(sources), dataclasses.replace(config, plain_first=False),
                                 None if prefixes is None else only(prefixes), terms=(only(terms[0]), only(terms[1])))
            for i, hyps in zip(again, redone):
                found[i] = hyps
        return found

    @torch.inference_mode()
    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Each target token's log-probability (</s> last) given its source and the tokens before
        it; an ensemble averages the models' probabilities, as the search does."""
        widths = [max(len(s), len(t)) + 1 for s, t in zip(sources, targets)]
        order = sorted(range(len(sources)), key=widths.__getitem__)
        results: list[list[float]] = [[] for _ in sources]
        for batch in batches(order, widths, self.max_tokens, self.batch_size):
            run = functools.partial(self._score, sources=sources, targets=targets)
            for i, scores in zip(batch, self._fitting(batch, run, lambda i: f"a single pair of {widths[i]} tokens")):
                results[i] = scores
        return results

    def _fitting(self, batch: list[int], run: Callable[[list[int]], list], single: Callable[[int], str]) -> list:
        """`run(batch)`; where the device runs out of memory, that of its two halves."""
        try:
            return run(batch)
        except RuntimeError as e:  # CUDA's OutOfMemoryError is one
            if not out_of_memory(e):
                raise
            cuda = isinstance(e, torch.cuda.OutOfMemoryError)
            what = "CUDA out of memory" if cuda else "out of memory"
            if len(batch) == 1:
                raise NmtError(f"{what} translating {single(batch[0])}; use a smaller --beam"
                               f"{' or --device cpu' if cuda else ''}") from None
        self.models.release_graphs()  # their padded caches are the largest buffers kept
        if cuda:
            torch.cuda.empty_cache()
        if not self.halved:
            self.warn(f"warning: {what} for {len(batch)} sentences at once: translating such batches "
                      "in halves (a smaller --max-tokens avoids the retries)")
            self.halved = True
        half = len(batch) // 2
        return self._fitting(batch[:half], run, single) + self._fitting(batch[half:], run, single)

    def _search(self, batch: list[int], sources: list[list[int]], prefixes: list[list[int]] | None,
                config: SearchConfig, terms: Phrases | None, rng: torch.Generator) -> list[list[Hypothesis]]:
        src = self._padded([sources[i] + [EOS_ID] for i in batch])
        forced = None
        if prefixes is not None and any(prefixes[i] for i in batch):
            forced = self._padded([prefixes[i] for i in batch], value=-1)
        columns = None
        if self.shortlist is not None:  # the batch's candidates, its prefixes' and phrases' tokens
            wanted = [prefixes[i] for i in batch] if prefixes is not None else []
            wanted += [ids for i in batch for ids in terms[0][i]] if terms is not None else []
            columns = self.shortlist.columns([sources[i] for i in batch], itertools.chain(*wanted), self.device)
        if config.sampling:
            return sample(self.models, src, config, rng, forced, columns)
        held = None
        if terms is not None and any(terms[0][i] or terms[1][i] for i in batch):
            held = Terms([terms[0][i] for i in batch], [terms[1][i] for i in batch], self.device, self.joining)
        return beam_search(self.models, src, config, forced, held, columns)

    def _score(self, batch: list[int], sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        src = self._padded([sources[i] + [EOS_ID] for i in batch])
        tgt_in = self._padded([[BOS_ID] + targets[i] for i in batch])
        tgt_out = self._padded([targets[i] + [EOS_ID] for i in batch]).unsqueeze(-1)
        token_log_probs = []
        for model in self.models.models:  # log p = logit - logsumexp: no (tokens, vocab) log-probabilities
            logits = model(src, tgt_in).float()
            token_log_probs.append((logits.gather(-1, tgt_out) - logits.logsumexp(-1, keepdim=True)).squeeze(-1))
        log_probs = averaged(token_log_probs)
        return [row[:len(targets[i]) + 1] for row, i in zip(log_probs.tolist(), batch)]

    def _padded(self, rows: list[list[int]], value: int = PAD_ID) -> torch.Tensor:
        return pad([np.array(row, dtype=np.int64) for row in rows], value=value).to(self.device)


def width(source: Sequence[int]) -> int:
    """The tokens a source takes in a batch's rows: its own and </s>."""
    return len(source) + 1


def fits(sentences: int, longest: int, max_tokens: int) -> bool:
    """Whether `sentences` sources whose widest is `longest` tokens (`width`) make one batch of
    at most `max_tokens` tokens, padding included: the rule of every search's batches, the
    server's searches of several requests too (serve/batcher.py)."""
    return sentences * longest <= max_tokens


def batches(order: list[int], widths: list[int], max_tokens: int, batch_size: int | None) -> Iterator[list[int]]:
    """Consecutive runs of the width-sorted `order` within `max_tokens` (padded) and `batch_size`."""
    batch: list[int] = []
    for i in order:
        too_many = batch_size is not None and len(batch) >= batch_size
        if batch and (too_many or not fits(len(batch) + 1, widths[i], max_tokens)):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch
