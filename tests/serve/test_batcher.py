"""The server's translation thread (batcher.py) with a stand-in engine whose searches are
written down: a request larger than a search's batch (--max-tokens) is cut into searches, by
length; a small request that comes after a large one waits one search; requests with the same
options share one; a request past --max-source-tokens is refused; a draining batcher answers
ShuttingDown. With the real engine, the cut answers are those of one search."""

import signal
import threading
import time

import pytest
import torch
from conftest import tiny_checkpoint

from nmt_cli.config import SearchConfig
from nmt_cli.decode.ensemble import SearchInterrupted
from nmt_cli.decode.records import Translation
from nmt_cli.decode.search import Hypothesis
from nmt_cli.decode.translator import Translator
from nmt_cli.errors import NmtError
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.run_config import RunConfig, ServeConfig
from nmt_cli.serve.batcher import Batcher, RequestTooLarge, ShuttingDown


class Recorder:
    """An engine whose source ids are a line's words as numbers, whose search copies each source
    and writes down the sentences it was given; each search waits for `gate` when one is set."""

    def __init__(self) -> None:
        self.searches: list[list[str]] = []
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.deadline: float | None = None
        self.failure: Exception | None = None  # the next search raises it

    def source_ids(self, line: str, number: int = 1) -> list[int]:
        return [int(word) for word in line.split()]

    def checked(self, sources, config, constraints, avoid):
        return None if constraints is None and avoid is None else (constraints or [[]] * len(sources),
                                                                    avoid or [[]] * len(sources))

    def search_ids(self, sources: list[list[int]], config: SearchConfig, forced: list[list[int]] | None = None,
                   rng=None, terms=None) -> list[list[Hypothesis]]:
        self.searches.append([" ".join(map(str, ids)) for ids in sources])
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise SearchInterrupted("stopped")
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        return [[Hypothesis(ids, 0.0, 0.0)] for ids in sources]

    def translation(self, hypothesis: Hypothesis, phrases: list[str] | None = None, number: int = 1) -> Translation:
        return Translation(" ".join(map(str, hypothesis.tokens)), [], 0.0, 0.0)

    def stream(self, config: SearchConfig) -> None:  # the stream of a seeded request (none here)
        return None

    def stop_searches_at(self, deadline: float | None) -> None:
        self.deadline = deadline


class Serving(Batcher):
    """A batcher of one engine, on a thread of its own."""

    def __init__(self, engine, config: ServeConfig) -> None:
        super().__init__(config, [engine])
        self.engine = engine

    def submit(self, search: SearchConfig, lines: list[str]):
        return super().submit(self.engine, search, lines)


def batcher(engine, **options) -> Batcher:
    """A batcher of `engine` running on a thread of its own."""
    serving = Serving(engine, ServeConfig(**{"batch_window_ms": 0.0, **options}))
    serving.thread = threading.Thread(target=serving.run, daemon=True)
    serving.thread.start()
    return serving


def while_searching(serving: Batcher, recorder: Recorder, first: tuple, *others: tuple) -> list:
    """Submit `first` (options, lines), then `others` while its first search runs; their futures."""
    recorder.gate = threading.Event()
    futures = [serving.submit(*first)]
    assert recorder.started.wait(10)
    futures += [serving.submit(*request) for request in others]
    time.sleep(0.2)  # all queued before the first search ends
    recorder.gate.set()
    return futures


def texts(future) -> list[str]:
    return [hyps[0].text for hyps in future.result(timeout=10)]


def test_a_large_request_is_cut_into_searches_of_max_tokens_in_order():
    recorder = Recorder()
    lines = [" ".join([str(k)] * 3) for k in range(10)]  # 3 tokens and </s>: 2 x 4 in a search of 8
    answer = batcher(recorder, max_tokens=8).submit(SearchConfig(), lines)
    assert texts(answer) == lines
    assert [len(search) for search in recorder.searches] == [2, 2, 2, 2, 2]
    assert [line for search in recorder.searches for line in search] == lines


def test_a_request_is_cut_shortest_sentences_first_and_answered_in_order():
    recorder = Recorder()
    lines = ["1 2 3 4 5 6 7 8 9", "1", "2 3 4", "5", "6 7"]
    assert texts(batcher(recorder, max_tokens=8).submit(SearchConfig(), lines)) == lines
    assert recorder.searches == [["1", "5"], ["6 7", "2 3 4"], ["1 2 3 4 5 6 7 8 9"]]  # 2 x 2, 2 x 4, 1 x 10


def test_a_small_request_waits_one_search_not_a_whole_large_one():
    recorder = Recorder()
    large, small = while_searching(batcher(recorder, max_tokens=5), recorder,
                                   (SearchConfig(), [f"{k} {k} {k} {k}" for k in range(1, 6)]),  # five searches
                                   (SearchConfig(beam=2), ["9"]))  # other options: a search of its own
    assert texts(small) == ["9"] and texts(large)[-1] == "5 5 5 5"
    assert recorder.searches[1] == ["9"]  # right after the large request's first search
    assert len(recorder.searches) == 6


def test_requests_with_the_same_options_share_a_search_small_ones_first():
    recorder = Recorder()
    first, large, small = while_searching(batcher(recorder, max_tokens=8), recorder, (SearchConfig(), ["1"]),
                                          (SearchConfig(), ["2 2 2", "3 3 3", "4 4 4"]), (SearchConfig(), ["5"]))
    assert texts(first) == ["1"] and texts(small) == ["5"] and texts(large) == ["2 2 2", "3 3 3", "4 4 4"]
    assert recorder.searches == [["1"], ["2 2 2", "5"], ["3 3 3", "4 4 4"]]


def test_a_request_for_seeded_samples_has_searches_of_its_own():
    recorder = Recorder()
    seeded = SearchConfig(sampling=True, seed=3)
    first, one, other = while_searching(batcher(recorder, max_tokens=100), recorder, (SearchConfig(), ["1"]),
                                        (seeded, ["2"]), (seeded, ["3"]))
    assert texts(first) == ["1"] and texts(one) == ["2"] and texts(other) == ["3"]
    assert recorder.searches == [["1"], ["2"], ["3"]]


def test_a_request_past_max_source_tokens_is_refused_and_the_next_served():
    serving = batcher(Recorder(), max_source_tokens=5)
    with pytest.raises(RequestTooLarge, match="sentences 1 to 2 come to 6 source tokens, more than the server's "
                                              "--max-source-tokens 5"):
        serving.submit(SearchConfig(), ["1 2 3", "4 5 6", "7"]).result(timeout=10)
    assert texts(serving.submit(SearchConfig(), ["1 2 3 4 5"])) == ["1 2 3 4 5"]
    assert serving.submit(SearchConfig(), []).result(timeout=10) == []


def test_a_failed_search_fails_its_requests_and_the_next_are_served():
    recorder = Recorder()
    recorder.failure = NmtError("CUDA out of memory translating a single sentence")
    first, second = while_searching(batcher(recorder, max_tokens=100), recorder, (SearchConfig(), ["1"]),
                                    (SearchConfig(), ["2"]))
    with pytest.raises(NmtError, match="out of memory"):
        first.result(timeout=10)
    assert texts(second) == ["2"]  # a search of its own, after the failed one


def test_draining_answers_shutting_down_past_its_deadline():
    recorder = Recorder()
    recorder.gate = threading.Event()
    serving = batcher(recorder, max_tokens=1)
    cut = serving.submit(SearchConfig(), ["1", "2", "3"])
    assert recorder.started.wait(10)
    serving.drain(0.0)
    late = serving.submit(SearchConfig(), ["4"])
    recorder.gate.set()
    for future in (cut, late):
        with pytest.raises(ShuttingDown):
            future.result(timeout=10)
    serving.close()
    serving.thread.join(10)
    assert not serving.thread.is_alive()


def test_cut_searches_give_the_translations_of_one(tmp_path):
    bundle = load_bundle(tiny_checkpoint(tmp_path / "m.pt", seed=3))
    translator = Translator([bundle], RunConfig(), torch.device("cpu"))
    lines = ["a b c d", "p o n m l k", "", "e", "f g h i j k l m n o p a b c", "c c c", "h a", "b b a a"]
    search = SearchConfig(beam=3, max_len_b=5)
    found = batcher(translator.engine, max_tokens=6).submit(search, lines).result(timeout=60)
    alone = translator.hypotheses(lines, beam=3, max_len_b=5)
    assert [[t.text for t in hyps] for hyps in found] == [[t.text for t in hyps] for hyps in alone]
    sampled = SearchConfig(sampling=True, seed=11, nbest=2)
    found = batcher(translator.engine, max_tokens=1000).submit(sampled, lines).result(timeout=60)
    alone = translator.hypotheses(lines, sampling=True, seed=11, nbest=2)
    assert [[t.text for t in hyps] for hyps in found] == [[t.text for t in hyps] for hyps in alone]


def test_an_idle_batcher_lets_a_signal_taken_by_another_thread_be_handled():
    """Python runs a signal's handler on the main thread, which runs the batcher: when the kernel
    gives the signal to another thread (the web server's, say), an idle batcher still gets to it
    (nmt serve's SIGTERM drain, SIGHUP's keys) instead of waiting for the next request."""
    batcher = Batcher(ServeConfig(), [])
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: batcher.close())
    other = threading.Thread(target=lambda: (time.sleep(0.3), signal.pthread_kill(threading.get_ident(),
                                                                                  signal.SIGUSR1)))
    watchdog = threading.Timer(10, batcher.close)  # so that a failure ends
    try:
        start = time.monotonic()
        other.start()
        watchdog.start()
        batcher.run()
        assert time.monotonic() - start < 3
    finally:
        watchdog.cancel()
        other.join()
        signal.signal(signal.SIGUSR1, previous)
