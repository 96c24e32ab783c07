"""The translation thread of `nmt serve`. A request's sentences are made token ids as it arrives
(one encoder thread; refused past --max-source-tokens), then translated in searches of one batch
(--max-tokens source tokens, padding included): requests with the same search options share a search, and a request
with more tokens than a search is cut into several. Waiting requests take turns, a request cut
short going to the back of the line, so that a small request waits about one search, not for the
whole of a large one that came first.
"""

import queue
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from nmt_cli.config import SearchConfig
from nmt_cli.decode.constraints import Phrases
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.ensemble import SearchInterrupted
from nmt_cli.decode.generator import fits, width
from nmt_cli.decode.records import Translation
from nmt_cli.run_config import ServeConfig

DRAIN_MARGIN_SECONDS = 0.5  # of --drain-seconds, to answer before uvicorn ends the connections
# The longest the idle loop waits at once. Python runs a signal's handler (SIGTERM's drain, SIGHUP's
# keys) on the main thread between bytecodes; when the kernel hands the signal to another thread,
# a main thread blocked in a wait without a bound would not run it until a request came.
IDLE_WAIT_SECONDS = 0.25


class RequestTooLarge(ValueError):
    """A request with more source tokens than the server allows."""


class ShuttingDown(Exception):
    """The server stopped translating (SIGTERM) before it could answer."""


@dataclass
class Job:
    """A request: its search options and sentences, their token ids, which are left to translate
    (shortest first: a request cut into searches is cut as one search would batch it, by length),
    and the translations of those translated."""

    engine: Engine  # the model of the request's language pair
    search: SearchConfig
    lines: list[str]
    prefixes: list[str] | None = None  # each output starts with its sentence's
    attention: bool = False  # each best translation with its alignment
    constraints: list[list[str]] | None = None  # each output holds its sentence's phrases
    avoid: list[list[str]] | None = None  # and none of these
    terms: Phrases | None = None  # the phrases' ids
    sources: list[list[int]] = field(default_factory=list)
    forced: list[list[int]] = field(default_factory=list)  # the prefixes' ids
    order: list[int] = field(default_factory=list)
    found: dict[int, list[Translation]] = field(default_factory=dict)
    done: Future = field(default_factory=Future)

    @property
    def left(self) -> list[list[int]]:
        """The token ids of the sentences not yet translated, in the order they will be."""
        return [self.sources[k] for k in self.order]


class Batcher:
    """Translates the waiting requests (`submit`) of `engines` on the thread that calls `run`:
    the thread that loaded the models, since PyTorch's CPU threads run a model slower for any other
    (tests/benchmarks/PERFORMANCE.md, session 23). Draining (SIGTERM), it goes on until a deadline,
    then stops its search and answers the rest with ShuttingDown. `searched`: told the sentences,
    source and target tokens of each search."""

    def __init__(self, config: ServeConfig, engines: Iterable[Engine],
                 searched: Callable[[int, int, int], None] = lambda sentences, source, target: None) -> None:
        self.config, self.engines, self.searched = config, list(engines), searched
        self.encoder = ThreadPoolExecutor(1, thread_name_prefix="nmt-encoder")
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.waiting: deque[Job] = deque()  # in turn order: a request cut short goes to the back
        self.closed = False
        self.requests = self.searches = 0
        self.deadline: float | None = None

    def submit(self, engine: Engine, search: SearchConfig, lines: list[str],
               prefixes: list[str] | None = None, attention: bool = False, constraints: list[list[str]] | None = None,
               avoid: list[list[str]] | None = None) -> Future:
        """A future of each line's translations by `engine`, best first (none for an empty
        line), each starting with its prefix when given, holding its `constraints` and none of
        the phrases to `avoid`, the best with its alignment when `attention`. Failed with
        RequestTooLarge, ShuttingDown, or what the search raised."""
        job = Job(engine, search, lines, prefixes, attention, constraints, avoid)
        self.requests += 1
        self.encoder.submit(self._encode, job)
        return job.done

    def waiting_requests(self) -> int:
        """Requests made token ids and waiting for their searches (or the rest of them)."""
        return len(self.waiting) + self.queue.qsize()

    def drain(self, seconds: float) -> None:
        """Translate what is waiting for at most `seconds` (less a margin); then answer ShuttingDown."""
        self.deadline = time.monotonic() + max(0.0, seconds - DRAIN_MARGIN_SECONDS)
        for engine in self.engines:
            engine.stop_searches_at(self.deadline)

    def close(self) -> None:
        """`run` returns once the requests that came have their answers."""
        self.encoder.shutdown(wait=True)  # each encoding is bounded: every request reaches the queue
        self.queue.put(None)

    def _encode(self, job: Job) -> None:
        """Make the request's sentences token ids and queue it, or fail it (too many tokens, draining)."""
        if not job.done.set_running_or_notify_cancel():
            return  # its client has gone
        limit, tokens = self.config.max_source_tokens, 0
        try:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise ShuttingDown
            for number, line in enumerate(job.lines, start=1):
                job.sources.append(ids := job.engine.source_ids(line, number))
                tokens += len(ids)
                if job.prefixes is not None:
                    job.forced.append(prefix := job.engine.prefix_ids(job.prefixes[number - 1], number))
                    tokens += len(prefix)
                if tokens > limit:
                    raise RequestTooLarge(f"sentences 1 to {number} come to {tokens} source tokens, more than the "
                                          f"server's --max-source-tokens {limit}")
            job.terms = job.engine.checked(job.sources, job.search, job.constraints, job.avoid)
        except Exception as e:  # noqa: BLE001 (the request fails, the server keeps serving)
            job.done.set_exception(e)
            return
        job.order = sorted(range(len(job.sources)), key=lambda k: len(job.sources[k]))
        if job.sources:
            self.queue.put(job)
        else:
            job.done.set_result([])  # nothing to translate

    def run(self) -> None:
        """Translate the requests as they come, until `close`."""
        while True:
            self._take(timeout=0 if self.waiting or self.closed else IDLE_WAIT_SECONDS)
            if not self.waiting:
                if self.closed:
                    return
                continue
            self._gather(self.waiting[0])
            self._run(self._next_search())

    def _take(self, timeout: float) -> None:
        """Move the requests that arrived to the line, waiting up to `timeout` seconds."""
        try:
            job = self.queue.get(timeout=timeout)
            while True:
                if job is None:
                    self.closed = True
                else:
                    self.waiting.append(job)
                job = self.queue.get_nowait()
        except queue.Empty:
            pass

    def _gather(self, first: Job) -> None:
        """Wait up to --batch-window-ms for requests to share `first`'s search while it has room."""
        deadline = time.monotonic() + self.config.batch_window_ms / 1000
        while not self.closed and (wait := deadline - time.monotonic()) > 0 and sum(
                tokens(job) for job in self.waiting if shared(job, first)) < self.config.max_tokens:
            self._take(wait)

    def _next_search(self) -> list[tuple[Job, int]]:
        """The next search, as (request, how many of its sentences left): a sentence of the first in
        line, whatever its length; then those of the requests with its options, fewest tokens left
        first, and more of the first, while they make one batch of the search (generator.fits)."""
        first = self.waiting[0]
        jobs = [first] if seeded(first.search) else [first, *sorted(
            (job for job in self.waiting if job is not first and shared(job, first)), key=tokens)]
        counts = [1] + [0] * (len(jobs) - 1)
        size, longest = 1, width(first.left[0])
        for k in [*range(1, len(jobs)), 0]:
            for ids in jobs[k].left[counts[k]:]:
                if not fits(size + 1, max(longest, width(ids)), self.config.max_tokens):
                    break
                size, longest, counts[k] = size + 1, max(longest, width(ids)), counts[k] + 1
        return [(job, count) for job, count in zip(jobs, counts) if count]

    def _run(self, taken: list[tuple[Job, int]]) -> None:
        """Search `taken`'s sentences; a request translated whole is answered, one cut short goes to
        the back of the line, and if the search fails, every request in it fails."""
        for job, _ in taken:
            self.waiting.remove(job)
        try:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise ShuttingDown
            search, engine = taken[0][0].search, taken[0][0].engine
            picked = [(job, k) for job, count in taken for k in job.order[:count]]  # the search's sentences
            sources = [job.sources[k] for job, k in picked]
            forced = [job.forced[k] for job, k in picked] if taken[0][0].forced else None
            terms = None
            if any(job.terms for job, _ in taken):
                terms = tuple([job.terms[side][k] if job.terms else [] for job, k in picked] for side in (0, 1))
            rng = engine.stream(search) if seeded(search) else None
            found = engine.search_ids(sources, search, forced, rng=rng, terms=terms)
        except Exception as e:  # noqa: BLE001 (the requests fail, the server keeps serving)
            error = ShuttingDown() if isinstance(e, SearchInterrupted) else e
            for job, _ in taken:
                job.done.set_exception(error)
            return
        self.searches += 1
        self.searched(len(found), sum(map(len, sources)), sum(len(hyps[0].tokens) for hyps in found if hyps))
        self._take(timeout=0)  # those that came during the search go before a request cut short
        for (job, k), hyps in zip(picked, found):
            job.found[k] = [engine.translation(h, phrases=job.constraints[k] if job.constraints else None,
                                               number=k + 1) for h in hyps]
            if job.attention and hyps:
                job.found[k][0].alignment = engine.alignment(job.sources[k], hyps[0])
        for job, count in taken:
            del job.order[:count]
            if job.order:
                self.waiting.append(job)
            else:
                job.done.set_result([job.found[k] for k in range(len(job.lines))])


def seeded(search: SearchConfig) -> bool:
    """Whether a request asks for the samples of a seed: its searches are its own, each started
    from the seed (the same request, the same samples, whatever else the server translates)."""
    return search.samples and search.seed is not None


def shared(job: Job, other: Job) -> bool:
    """Whether two requests may share a search: the same model, the same options, prefixes in both or neither."""
    return job.engine is other.engine and job.search == other.search and (
        (job.prefixes is None) == (other.prefixes is None))


def tokens(job: Job) -> int:
    """The source tokens of a request not yet translated."""
    return sum(map(len, job.left))
