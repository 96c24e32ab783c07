"""A model, or an ensemble, with its text pipeline on a device, as the steps a translation takes:
lines to token ids (`source_ids`, `prefix_ids`, `phrases`), ids searched (`search_ids`; `search`
does the three for a list of lines), hypotheses to results (`translation`, `alignment`,
`attention`, `labels`), given targets scored (`score`). `nmt translate` (translate.py) and `nmt
serve`'s batcher compose these steps, the batcher across requests; the Python API's Translator
(translator.py) offers them as calls.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.decode import mbr
from nmt_cli.decode.constraints import Phrases, positions
from nmt_cli.decode.generator import Generator
from nmt_cli.decode.pipeline import TextPipeline, joining_ids
from nmt_cli.decode.records import Scored, Translation, attention_record
from nmt_cli.decode.search import Hypothesis, max_lengths, penalty_of
from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.errors import NmtError
from nmt_cli.model.checkpoint import ModelBundle
from nmt_cli.run_config import RunConfig
from nmt_cli.text.vocab import BOS_ID, EOS_ID

CHUNK_LINES = 4096  # lines searched together: sorted by length, then batched by tokens


def checked_lines(lines: Any, what: str = "lines", first_number: int = 1, item: str = "line") -> list[str]:
    """`lines` as a list of str, or an NmtError naming what is not one (a file opened in binary
    mode gives bytes); `item`: what each is called."""
    if not isinstance(lines, (list, tuple)):
        one = " (or one str)" if what == "lines" else ""
        raise NmtError(f"{what}: expected a list of str{one}, got {type(lines).__name__}")
    for number, line in enumerate(lines, first_number):
        if not isinstance(line, str):
            hint = " (open files in text mode: open(path, encoding='utf-8'))" if isinstance(line, bytes) else ""
            raise NmtError(f"{what}: {item} {number} is {type(line).__name__}, not str{hint}")
    return list(lines)


def checked_phrases(given: Any, what: str, first_number: int = 1) -> list[list[str]] | None:
    """Each line's phrases (`constraints` or `avoid`) as a list of str (None for a line: none)."""
    if given is None:
        return None
    if not isinstance(given, (list, tuple)):
        raise NmtError(f"{what}: expected a list of phrases for each line, got {type(given).__name__}")
    return [checked_lines(phrases or [], f"{what} of line {number}", item="phrase")
            for number, phrases in enumerate(given, first_number)]


def model_search(bundle: ModelBundle, given: dict[str, Any]) -> SearchConfig:
    """The search options `given`, the others those the model is run with: an imported model's
    release settings (`nmt import`), else nmt-cli's defaults."""
    return SearchConfig(**{**bundle.released.search, **given})


class Engine:
    """`bundles`' models (one, or an ensemble: their probabilities averaged at each step) searching
    on `device` in `dtype`, with the first one's text pipeline; `config` holds the defaults of
    every search; `warn` takes the warnings (stderr); with a `shortlist`, each batch's output
    layer is cut to its columns."""

    def __init__(self, bundles: list[ModelBundle], config: RunConfig, device: torch.device,
                 dtype: torch.dtype = torch.float32, warn: Callable[[str], None] | None = None,
                 shortlist: Shortlist | None = None) -> None:
        first = bundles[0]
        for other in bundles[1:]:
            if other.tgt_vocab != first.tgt_vocab or other.src_vocab != first.src_vocab:
                raise NmtError("ensemble members must share their vocabularies")
        self.config, self.device, self.dtype, self.bundle, self.members = config, device, dtype, first, len(bundles)
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        self.generator = Generator([b.model for b in bundles], device, dtype, max_tokens=config.max_tokens,
                                   batch_size=config.batch_size, never=first.never, joining=joining_ids(first),
                                   graphs=config.cuda_graphs, quantize=config.quantize, seed=config.search.seed,
                                   shortlist=shortlist, warn=self.warn)
        self.pipeline = TextPipeline(first, self.generator.models.max_positions, config.input_format,
                                     config.output_format, self.warn)
        self._unfitting = False  # a line's constraints did not fit its length limit (warned once)

    def stream(self, config: SearchConfig, given: Collection[str] = ("seed",)) -> torch.Generator | None:
        """A random stream of a call's own when it gives a seed (`given` holds "seed"): the same
        seed, the same samples, whatever other threads draw meanwhile; None: the engine's."""
        if not config.samples or "seed" not in given or config.seed is None:
            return None
        return self.generator.stream(config.seed)

    def search(self, lines: list[str], config: SearchConfig, prefixes: list[str] | None = None,
               first_number: int = 1, rng: torch.Generator | None = None, constraints: list[list[str]] | None = None,
               avoid: list[list[str]] | None = None) -> tuple[list[list[int]], list[list[Hypothesis]]]:
        """The source ids of `lines` and their hypotheses; lines are numbered from `first_number`
        in warnings. Samples continue the engine's random stream, or `rng` (a seed given for
        one call repeats its samples)."""
        lines = checked_lines(lines, "lines", first_number)
        prefixes = None if prefixes is None else checked_lines(prefixes, "prefixes", first_number)
        constraints, avoid = checked_phrases(constraints, "constraints", first_number), \
            checked_phrases(avoid, "avoid", first_number)
        for name, given in (("prefixes", prefixes), ("constraints", constraints), ("avoid", avoid)):
            if given is not None and len(given) != len(lines):
                raise NmtError(f"{len(lines)} lines but {len(given)} {name}")
        sources = [self.source_ids(line, first_number + k) for k, line in enumerate(lines)]
        forced = None if prefixes is None else [self.prefix_ids(prefix, first_number + k)
                                                for k, prefix in enumerate(prefixes)]
        terms = self.checked(sources, config, constraints, avoid, first_number)
        found = self.search_ids(sources, config, forced, rng, first_number, terms)
        for k, (phrases, hyps) in enumerate(zip(constraints or [], found)):
            if lacking := self.missing(phrases, hyps[0].tokens if hyps else [], first_number + k):
                self.warn(f"warning: line {first_number + k}: its translation lacks {', '.join(map(repr, lacking))} "
                          "(a constraint not held)")
        return sources, found

    def checked(self, sources: list[list[int]], config: SearchConfig, constraints: list[list[str]] | None,
                avoid: list[list[str]] | None, first_number: int = 1) -> Phrases | None:
        """What a request asks of its lines (their source ids), checked: a --min-len above a line's
        length limit, or a phrase to avoid inside a phrase to include, is refused naming the line
        (no translation could do both); a line whose phrases cannot fit its length limit is warned
        once. The target ids of each line's phrases to include and to avoid (None: none given)."""
        phrased = any(constraints or []) or any(avoid or [])
        if not phrased and not config.min_len:
            return None  # nothing to check: no lengths to compute
        number = range(first_number, first_number + len(sources))
        limits = max_lengths(torch.tensor([len(s) for s in sources], dtype=torch.long), config,
                             self.generator.models.max_positions).tolist()
        for limit, n in zip(limits, number):
            if config.min_len > limit:
                raise NmtError(f"line {n}: --min-len {config.min_len} is more than its output may hold ({limit} "
                               "tokens, from --max-len-a, --max-len-b, --max-len and the model's positions)")
        if not phrased:
            return None
        if config.samples:
            raise NmtError("constraints apply to beam search, not with --sampling or --mbr-candidates sample")
        include = [self.pipeline.phrase_ids(p, n) for p, n in zip(constraints or [[]] * len(sources), number)]
        for ids, avoided, limit, n in zip(include, avoid or [[]] * len(sources), limits, number):
            for phrase in avoided:
                if (q := self.pipeline.phrase_ids([phrase], n)) and any(positions(q[0], p) for p in ids):
                    raise NmtError(f"line {n}: {phrase!r} is to be avoided and is part of a phrase to include")
            if sum(map(len, ids)) > limit and not self._unfitting:
                self.warn(f"warning: line {n}: its constraints ({sum(map(len, ids))} tokens) do not fit its output's "
                          f"length limit ({limit}): it is translated without some (warned once)")
                self._unfitting = True
        return include, [self.pipeline.phrase_ids(p, n) for p, n in zip(avoid or [[]] * len(sources), number)]

    def missing(self, phrases: list[str], output: list[int], number: int = 1) -> list[str]:
        """The phrases to include (line `number`'s) that an `output` (target ids) lacks, one with a
        token the model's vocabulary lacks (left out of the search) among them."""
        lacking = []
        for phrase in filter(str.strip, phrases):
            ids = self.pipeline.phrase_ids([phrase], number)
            if not ids or not self.generator.holds(output, ids):
                lacking.append(phrase)
        return lacking

    def source_ids(self, line: str, number: int = 1) -> list[int]:
        """The token ids of a source line (`number`: its number in warnings)."""
        return self.pipeline.source_ids(line, number)

    def prefix_ids(self, prefix: str, number: int = 1) -> list[int]:
        """The target ids of a prefix (`number`: its line's number in warnings)."""
        return self.pipeline.target_ids(prefix, number)

    def search_ids(self, sources: list[list[int]], config: SearchConfig, forced: list[list[int]] | None = None,
                   rng: torch.Generator | None = None, first_number: int = 1,
                   terms: Phrases | None = None) -> list[list[Hypothesis]]:
        """The hypotheses of sources given as token ids (`source_ids`), each starting with its
        prefix's ids when `forced` (`prefix_ids`) and holding its `terms` (`phrases`); an empty
        source with a prefix: the prefix alone. With --mbr, the candidates in the order of their
        expected utility (mbr.py)."""
        found = self.generator.search(sources, config.candidates(), forced, rng, terms)
        if config.mbr is not None:
            u = mbr.utility(config.mbr_utility)
            texts = ([self.pipeline.detokenized(h.tokens) for h in hyps] for hyps in found)
            found = [[hyps[i] for i in mbr.ranking(each, u)[:config.nbest]] for hyps, each in zip(found, texts)]
        for k, (source, prefix) in enumerate(zip(sources, forced or [])):
            if not source and prefix:
                found[k] = [Hypothesis(self.pipeline.prefix_alone(prefix, first_number + k), 0.0, 0.0)]
        return found

    def translation(self, hypothesis: Hypothesis, alignment: dict[str, Any] | None = None,
                    phrases: list[str] | None = None, number: int = 1) -> Translation:
        """A hypothesis as the API gives it back; with the `phrases` to include of its line
        (`number`), those it lacks."""
        return Translation(self.pipeline.text(hypothesis.tokens), self.pipeline.tokens(hypothesis.tokens),
                           hypothesis.score, hypothesis.log_prob, alignment,
                           None if phrases is None else self.missing(phrases, hypothesis.tokens, number))

    def alignment(self, source: list[int], hypothesis: Hypothesis) -> dict[str, Any]:
        """The cross-attention of the last decoder layer between a source (its ids) and a
        hypothesis, heads averaged: one row of source weights per output token (an alignment)."""
        weights = self.attention(source, hypothesis.tokens)
        return attention_record(weights, None, self.labels(source, hypothesis.tokens))

    def labels(self, source: list[int], output: list[int]) -> tuple[list[str], list[str]]:
        """The tokens of a source and an output (their ids), </s> included, as pictures label them."""
        return self.pipeline.labels(source, output)

    def attention(self, source: list[int], output: list[int]) -> dict[str, list[torch.Tensor]]:
        """Every attention distribution of the first model on (source, its translation)."""
        model = self.generator.models.models[0]
        src = torch.tensor([source + [EOS_ID]], device=self.device)
        tgt_in = torch.tensor([[BOS_ID] + output], device=self.device)
        return model.attention_weights(src, tgt_in)

    def stop_searches_at(self, deadline: float | None) -> None:
        """Searches raise SearchInterrupted at their next step once time.monotonic() passes
        `deadline` (a draining server); None: never."""
        self.generator.models.deadline = deadline

    def score(self, sources: list[str], targets: list[str], first_number: int = 1) -> list[Scored]:
        """The model's log-probability of each target given its source (fairseq's
        --score-reference, CTranslate2's score_batch): to filter a corpus, or rerank."""
        sources = checked_lines(sources, "sources", first_number)
        targets = checked_lines(targets, "targets", first_number)
        if len(sources) != len(targets):
            raise NmtError(f"{len(sources)} sources but {len(targets)} targets")
        source_ids = [self.pipeline.source_ids(line, first_number + k) for k, line in enumerate(sources)]
        target_ids = [self.pipeline.target_ids(line, first_number + k, "reference") for k, line in enumerate(targets)]
        search = self.config.search
        return [Scored(sum(scores), sum(scores) / penalty_of(search)(len(scores)),
                       self.pipeline.tokens(ids) + ["</s>"], scores)
                for ids, scores in zip(target_ids, self.generator.score(source_ids, target_ids))]
