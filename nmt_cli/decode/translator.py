"""Translation from Python (`from nmt_cli import Translator`): a trained model, or an ensemble,
with its text pipeline. It composes the layers that `nmt translate` and `nmt serve` use too:
token ids searched by a Generator (generator.py), text by a TextPipeline (pipeline.py),
results as records (records.py).

    translator = Translator.load("avg.pt")
    translator.translate(["A man rides a bike."])                  # ['Ein Mann fährt Fahrrad.']
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, overload

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.decode.constraints import Phrases
from nmt_cli.decode.generator import Generator
from nmt_cli.decode.pipeline import TextPipeline, joining_ids
from nmt_cli.decode.records import Scored, Translation, attention_record
from nmt_cli.decode.search import Hypothesis, length_penalty, max_lengths
from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.device import select
from nmt_cli.errors import NmtError
from nmt_cli.lines import chunks
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.options import check_applies
from nmt_cli.run_config import RunConfig
from nmt_cli.text.vocab import BOS_ID, EOS_ID

if TYPE_CHECKING:
    from typing_extensions import Unpack

CHUNK_LINES = 4096  # lines searched together: sorted by length, then batched by tokens


class SearchOptions(TypedDict, total=False):
    """The search options a call may set, SearchConfig's fields (`nmt translate`'s flags): typed
    for type checkers and IDEs (tests/decode/test_translator.py holds the two equal)."""

    beam: int
    lenpen: float
    lenpen_form: Literal["gnmt", "length"]
    stopping: Literal["early", "heuristic"]
    max_len_a: float
    max_len_b: int
    max_len: int | None
    nbest: int
    allow_unk: bool
    min_len: int
    no_repeat_ngram_size: int
    repetition_penalty: float
    plain_first: bool
    sampling: bool
    sampling_topk: int | None
    sampling_topp: float | None
    temperature: float
    seed: int | None


class LoadOptions(SearchOptions, total=False):
    """What Translator.load takes besides the search options: RunConfig's other fields."""

    device: str
    precision: Literal["auto", "fp32", "bf16", "fp16"]
    threads: int | None
    quantize: Literal["int8"] | None
    cuda_graphs: bool
    max_tokens: int
    batch_size: int | None
    input_format: Literal["raw", "bpe"]
    output_format: Literal["text", "tokens", "bpe"]


LOAD_OPTIONS = tuple(name for name in LoadOptions.__annotations__ if name not in SearchOptions.__annotations__)
Method = TypeVar("Method", bound=Callable[..., Any])


def spelled_out(options: type) -> Callable[[Method], Method]:
    """A method whose `**options` are shown as the keyword parameters they are, with their types
    and nmt-cli's defaults (the Translator's own, a released model's say, replace them), to
    help() and inspect.signature."""
    defaults = {**SearchConfig().to_dict(), **RunConfig().to_dict()}

    def spell(method: Method) -> Method:
        signature = inspect.signature(method)
        named = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults[name], annotation=hint)
                    for name, hint in typing.get_type_hints(options).items()]
        method.__signature__ = signature.replace(parameters=named + keywords)  # type: ignore[attr-defined]
        return method
    return spell


def one_line(line: str, prefix: str | None, constraints: list[str] | None,
             avoid: list[str] | None) -> tuple[list[str], list[str] | None, list[list[str]] | None,
                                                list[list[str]] | None]:
    """One line's arguments as those of a list of one line."""
    for name, given in (("constraints", constraints), ("avoid", avoid)):
        if isinstance(given, str):
            raise NmtError(f"{name}: a list of phrases for one line, not a str ({given!r})")
    return ([line], None if prefix is None else [prefix], None if constraints is None else [constraints],
            None if avoid is None else [avoid])


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


def load_shortlist(path: Path, bundle: ModelBundle) -> Shortlist:
    """The shortlist at `path`, refused unless it was made for the model's vocabularies."""
    shortlist = Shortlist.load(path)
    shortlist.check(bundle.src_vocab.tokens, bundle.tgt_vocab.tokens, str(path))
    return shortlist


def model_search(bundle: ModelBundle, given: dict[str, Any]) -> SearchConfig:
    """The search options `given`, the others those the model is run with: an imported model's
    release settings (`nmt import`), else nmt-cli's defaults."""
    return SearchConfig(**{**bundle.released.search, **given})


class Translator:
    """A model (or an ensemble: their probabilities averaged at each step) with its text
    pipeline. `config` holds the defaults of every call; `warn` takes the warnings (stderr).

    The calls: load, translate, hypotheses, translate_iter, score. Below them, the steps of a
    search (source_ids, prefix_ids, phrases, search_ids, translation, alignment), which `nmt
    translate` and `nmt serve` compose to batch lines from many requests."""

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

    @classmethod
    @spelled_out(LoadOptions)
    def load(cls, *paths: str | Path, warn: Callable[[str], None] | None = None, shortlist: str | Path | None = None,
             **options: Unpack[LoadOptions]) -> Translator:
        """The model of a checkpoint or `nmt export` safetensors file (several: an ensemble), with
        the `shortlist` of `nmt shortlist` when given (each batch's output layer cut to it).
        `options`: device ("auto": CUDA when there is one), precision, threads, quantize ("int8"),
        cuda_graphs, max_tokens, batch_size, input_format, output_format, and any search option
        (beam, lenpen, ...: the defaults of every call; those not given are the model's own: an
        imported model's release settings, else nmt-cli's). It changes no setting of the caller's
        process but PyTorch's CPU threads, and those only when `threads` is given."""
        if not paths:
            raise TypeError("Translator.load() needs the path of at least one checkpoint")
        unknown = sorted(set(options) - set(LOAD_OPTIONS) - {f.name for f in dataclasses.fields(SearchConfig)})
        if unknown:
            raise TypeError(f"Translator.load() got an unexpected option {unknown[0]!r}")
        search = {key: value for key, value in options.items() if key not in LOAD_OPTIONS}
        bundles = [load_bundle(Path(path)) for path in paths]
        try:
            config = RunConfig(search=model_search(bundles[0], search), **{k: options[k] for k in LOAD_OPTIONS
                                                                           if k in options})
            check_applies(config.search, search, name=lambda f: f.name)
        except ValueError as e:
            raise NmtError(str(e)) from None
        device, dtype = select(config.run_on, config.precision)
        if config.threads:  # asked for: the only process setting the API changes
            torch.set_num_threads(config.threads)
        return cls(bundles, config, device, dtype, warn, None if shortlist is None else
                   load_shortlist(Path(shortlist), bundles[0]))

    def stream(self, config: SearchConfig, given: Collection[str] = ("seed",)) -> torch.Generator | None:
        """A random stream of a call's own when it gives a seed (`given` holds "seed"): the same
        seed, the same samples, whatever other threads draw meanwhile; None: the translator's."""
        if not config.sampling or "seed" not in given or config.seed is None:
            return None
        return self.generator.stream(config.seed)

    def search_config(self, **search: Unpack[SearchOptions]) -> SearchConfig:
        """The configured search options with `search` given for one call (checked as flags are)."""
        unknown = sorted(set(search) - set(SearchOptions.__annotations__))
        if unknown:
            raise TypeError(f"unexpected option {unknown[0]!r}; the search options are "
                            f"{', '.join(SearchOptions.__annotations__)}")
        try:
            config = dataclasses.replace(self.config.search, **search)
            check_applies(config, search, name=lambda f: f.name)
        except ValueError as e:
            raise NmtError(str(e)) from None
        return config

    def __repr__(self) -> str:
        search = self.config.search
        how = "sampling" if search.sampling else f"beam {search.beam}, lenpen {search.lenpen:g}"
        return f"Translator({self.members} model(s), {self.device} {str(self.dtype).removeprefix('torch.')}, {how})"

    @overload
    def translate(self, lines: str, prefixes: str | None = None, constraints: list[str] | None = None,
                  avoid: list[str] | None = None, **search: Unpack[SearchOptions]) -> str: ...

    @overload
    def translate(self, lines: list[str], prefixes: list[str] | None = None,
                  constraints: list[list[str]] | None = None, avoid: list[list[str]] | None = None,
                  **search: Unpack[SearchOptions]) -> list[str]: ...

    @spelled_out(SearchOptions)
    def translate(self, lines: str | list[str], prefixes: Any = None, constraints: Any = None, avoid: Any = None,
                  **search: Unpack[SearchOptions]) -> str | list[str]:
        """The best translation of each line (an empty line: an empty one), each starting with its
        prefix when given, holding each of its `constraints` (phrases, in any order) and none of
        the phrases it should `avoid`; `search`: beam, lenpen, max_len_a, sampling, seed, ... for
        this call. One line (a str, with its own prefix and phrases) gives one translation."""
        if isinstance(lines, str):
            return self.translate(*one_line(lines, prefixes, constraints, avoid), **search)[0]
        return [nbest[0].text if nbest else ""
                for nbest in self.hypotheses(lines, prefixes, constraints, avoid, **search)]

    @overload
    def hypotheses(self, lines: str, prefixes: str | None = None, constraints: list[str] | None = None,
                   avoid: list[str] | None = None, attention: bool = False,
                   **search: Unpack[SearchOptions]) -> list[Translation]: ...

    @overload
    def hypotheses(self, lines: list[str], prefixes: list[str] | None = None,
                   constraints: list[list[str]] | None = None, avoid: list[list[str]] | None = None,
                   attention: bool = False, **search: Unpack[SearchOptions]) -> list[list[Translation]]: ...

    @spelled_out(SearchOptions)
    def hypotheses(self, lines: str | list[str], prefixes: Any = None, constraints: Any = None, avoid: Any = None,
                   attention: bool = False,
                   **search: Unpack[SearchOptions]) -> list[Translation] | list[list[Translation]]:
        """Each line's `nbest` translations (or samples), best first, with their scores, and with
        `attention` each one's alignment to its source (CTranslate2's return_attention); one line
        (a str) gives its own list."""
        if isinstance(lines, str):
            return self.hypotheses(*one_line(lines, prefixes, constraints, avoid), attention=attention, **search)[0]
        if not isinstance(attention, bool):
            raise NmtError(f"attention={attention!r}: expected true or false")
        config = self.search_config(**search)
        sources, found = self.search(lines, config, prefixes, rng=self.stream(config, search),
                                     constraints=constraints, avoid=avoid)
        return [[self.translation(h, self.alignment(source, h) if attention else None) for h in hyps]
                for source, hyps in zip(sources, found)]

    @spelled_out(SearchOptions)
    def translate_iter(self, lines: Iterable[str], chunk_lines: int = CHUNK_LINES,
                       **search: Unpack[SearchOptions]) -> Iterator[str]:
        """The best translation of each line of an iterable of any length (a file, say), in order,
        holding `chunk_lines` lines at a time."""
        config = self.search_config(**search)
        count, rng = 0, self.stream(config, search)  # one stream for all chunks
        if isinstance(lines, (str, bytes)) or not isinstance(lines, Iterable):
            raise NmtError(f"lines: expected an iterable of lines (a list, a text file), got {type(lines).__name__}")
        for chunk in chunks(lines, chunk_lines):
            chunk = [line.rstrip("\n") for line in checked_lines(chunk, "lines", count + 1)]
            _, found = self.search(chunk, config, first_number=count + 1, rng=rng)
            yield from (self.pipeline.text(hyps[0].tokens) if hyps else "" for hyps in found)
            count += len(chunk)

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
        return [Scored(sum(scores), sum(scores) / length_penalty(len(scores), search.lenpen, search.lenpen_form),
                       self.pipeline.tokens(ids) + ["</s>"], scores)
                for ids, scores in zip(target_ids, self.generator.score(source_ids, target_ids))]

    def search(self, lines: list[str], config: SearchConfig, prefixes: list[str] | None = None,
               first_number: int = 1, rng: torch.Generator | None = None, constraints: list[list[str]] | None = None,
               avoid: list[list[str]] | None = None) -> tuple[list[list[int]], list[list[Hypothesis]]]:
        """The source ids of `lines` and their hypotheses; lines are numbered from `first_number`
        in warnings. Samples continue the translator's random stream, or `rng` (a seed given for
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
        terms = self.phrases(sources, config, constraints, avoid, first_number)
        return sources, self.search_ids(sources, config, forced, rng, first_number, terms)

    def phrases(self, sources: list[list[int]], config: SearchConfig, constraints: list[list[str]] | None,
                avoid: list[list[str]] | None, first_number: int = 1) -> Phrases | None:
        """The target ids of each line's phrases to include and to avoid (None: none given); a
        line whose phrases cannot fit its output's length limit is warned once."""
        if not any(constraints or []) and not any(avoid or []):
            return None
        if config.sampling:
            raise NmtError("constraints apply to beam search, not with --sampling")
        number = range(first_number, first_number + len(sources))
        include = [self.pipeline.phrase_ids(p, n) for p, n in zip(constraints or [[]] * len(sources), number)]
        limits = max_lengths(torch.tensor([len(s) for s in sources]), config,
                             self.generator.models.max_positions).tolist()
        for ids, limit, n in zip(include, limits, number):
            if sum(map(len, ids)) > limit and not self._unfitting:
                self.warn(f"warning: line {n}: its constraints ({sum(map(len, ids))} tokens) do not fit its output's "
                          f"length limit ({limit}): it is translated without some (warned once)")
                self._unfitting = True
        return include, [self.pipeline.phrase_ids(p, n) for p, n in zip(avoid or [[]] * len(sources), number)]

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
        source with a prefix: the prefix alone."""
        found = self.generator.search(sources, config, forced, rng, terms)
        for k, (source, prefix) in enumerate(zip(sources, forced or [])):
            if not source and prefix:
                found[k] = [Hypothesis(self.pipeline.prefix_alone(prefix, first_number + k), 0.0, 0.0)]
        return found

    def alignment(self, source: list[int], hypothesis: Hypothesis) -> dict[str, Any]:
        """The cross-attention of the last decoder layer between a source (its ids) and a
        hypothesis, heads averaged: one row of source weights per output token (an alignment)."""
        weights = self.attention(source, hypothesis.tokens)
        return attention_record(weights, None, self.labels(source, hypothesis.tokens))

    def labels(self, source: list[int], output: list[int]) -> tuple[list[str], list[str]]:
        """The tokens of a source and an output (their ids), </s> included, as pictures label them."""
        return self.pipeline.labels(source, output)

    def stop_searches_at(self, deadline: float | None) -> None:
        """Searches raise SearchInterrupted at their next step once time.monotonic() passes
        `deadline` (a draining server); None: never."""
        self.generator.models.deadline = deadline

    def translation(self, hypothesis: Hypothesis, alignment: dict[str, Any] | None = None) -> Translation:
        return Translation(self.pipeline.text(hypothesis.tokens), self.pipeline.tokens(hypothesis.tokens),
                           hypothesis.score, hypothesis.log_prob, alignment)

    def attention(self, source: list[int], output: list[int]) -> dict[str, list[torch.Tensor]]:
        """Every attention distribution of the first model on (source, its translation)."""
        model = self.generator.models.models[0]
        src = torch.tensor([source + [EOS_ID]], device=self.device)
        tgt_in = torch.tensor([[BOS_ID] + output], device=self.device)
        return model.attention_weights(src, tgt_in)
