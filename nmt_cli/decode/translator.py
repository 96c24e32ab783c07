"""Translation from Python (`from nmt_cli import Translator`): a trained model, or an ensemble,
with its text pipeline, as calls with checked arguments and typed options. Below them is an
Engine (engine.py): the steps that `nmt translate` and `nmt serve` compose too.

    translator = Translator.load("avg.pt")
    translator.translate(["A man rides a bike."])                  # ['Ein Mann fährt Fahrrad.']
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, overload

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import CHUNK_LINES, Engine, checked_lines, model_search
from nmt_cli.decode.records import Scored, Translation
from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.device import select
from nmt_cli.errors import NmtError
from nmt_cli.lines import chunks
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.options import check_applies
from nmt_cli.run_config import RunConfig

if TYPE_CHECKING:
    from typing_extensions import Unpack

class SearchOptions(TypedDict, total=False):
    """The search options a call may set, SearchConfig's fields (`nmt translate`'s flags): typed
    for type checkers and IDEs (tests/decode/test_translator.py holds the two equal)."""

    beam: int
    lenpen: float
    lenpen_form: Literal["gnmt", "length"]
    lenpen_start: bool
    stopping: Literal["early", "heuristic", "onmt"]
    at_limit: Literal["scored", "free", "cut"]
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
    mbr: int | None
    mbr_utility: Literal["chrf", "bleu"]
    mbr_candidates: Literal["beam", "sample"]


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


class Translator:
    """A model (or an ensemble: their probabilities averaged at each step) with its text
    pipeline. `config` holds the defaults of every call; `warn` takes the warnings (stderr).

    The calls: load, translate, hypotheses, translate_iter, score. `engine` runs them (engine.py):
    its steps are those that `nmt translate` and `nmt serve` compose."""

    def __init__(self, bundles: list[ModelBundle], config: RunConfig, device: torch.device,
                 dtype: torch.dtype = torch.float32, warn: Callable[[str], None] | None = None,
                 shortlist: Shortlist | None = None) -> None:
        self.engine = Engine(bundles, config, device, dtype, warn, shortlist)

    @property
    def config(self) -> RunConfig:
        """The defaults of every call: the search options, and how the model runs."""
        return self.engine.config

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
                   Shortlist.load(Path(shortlist), bundles[0]))

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
        if search.mbr is not None:
            how = f"MBR ({search.mbr_utility}) over {search.mbr} {search.mbr_candidates} candidates"
        engine = self.engine
        return (f"Translator({engine.members} model(s), {engine.device} {str(engine.dtype).removeprefix('torch.')}, "
                f"{how})")

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
        sources, found = self.engine.search(lines, config, prefixes, rng=self.engine.stream(config, search),
                                     constraints=constraints, avoid=avoid)
        return [[self.engine.translation(h, self.engine.alignment(source, h) if attention else None,
                                         constraints[k] if constraints else None, k + 1) for h in hyps]
                for k, (source, hyps) in enumerate(zip(sources, found))]

    @spelled_out(SearchOptions)
    def translate_iter(self, lines: Iterable[str], chunk_lines: int = CHUNK_LINES,
                       **search: Unpack[SearchOptions]) -> Iterator[str]:
        """The best translation of each line of an iterable of any length (a file, say), in order,
        holding `chunk_lines` lines at a time."""
        config = self.search_config(**search)
        count, rng = 0, self.engine.stream(config, search)  # one stream for all chunks
        if isinstance(lines, (str, bytes)) or not isinstance(lines, Iterable):
            raise NmtError(f"lines: expected an iterable of lines (a list, a text file), got {type(lines).__name__}")
        for chunk in chunks(lines, chunk_lines):
            chunk = [line.rstrip("\n") for line in checked_lines(chunk, "lines", count + 1)]
            _, found = self.engine.search(chunk, config, first_number=count + 1, rng=rng)
            yield from (self.engine.pipeline.text(hyps[0].tokens) if hyps else "" for hyps in found)
            count += len(chunk)

    def score(self, sources: list[str], targets: list[str], first_number: int = 1) -> list[Scored]:
        """The model's log-probability of each target given its source (fairseq's
        --score-reference, CTranslate2's score_batch): to filter a corpus, or rerank."""
        return self.engine.score(sources, targets, first_number)

