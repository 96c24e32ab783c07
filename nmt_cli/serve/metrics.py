"""What `nmt serve` has done, for Prometheus (`GET /metrics`, its text format; names prefixed
`nmt_`): requests by path and status, their latency, the sentences and tokens translated, the
sentences per search, and the requests waiting."""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SEARCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The server's counters, in a registry of their own (not prometheus_client's global one)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, waiting: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("nmt_requests", "HTTP requests answered, by path and status.", ["path", "status"],
                                registry=self.registry)
        self.latency = Histogram("nmt_request_seconds", "Time from a request's arrival to its answer.", ["path"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.sentences = Counter("nmt_sentences", "Sentences translated.", registry=self.registry)
        self.source_tokens = Counter("nmt_source_tokens", "Source tokens translated.", registry=self.registry)
        self.target_tokens = Counter("nmt_target_tokens", "Target tokens of the best translations.",
                                     registry=self.registry)
        self.search_sentences = Histogram("nmt_search_sentences", "Sentences per search (requests share them).",
                                          buckets=SEARCH_BUCKETS, registry=self.registry)
        waiting_requests = Gauge("nmt_waiting_requests", "Requests taken and not yet answered by the search.",
                                 registry=self.registry)
        waiting_requests.set_function(waiting)

    def answered(self, path: str, status: int, seconds: float) -> None:
        self.requests.labels(path, str(status)).inc()
        self.latency.labels(path).observe(seconds)

    def searched(self, sentences: int, source_tokens: int, target_tokens: int) -> None:
        """A search's sentences, their tokens and those of their best translations."""
        self.search_sentences.observe(sentences)
        self.sentences.inc(sentences)
        self.source_tokens.inc(source_tokens)
        self.target_tokens.inc(target_tokens)

    def text(self) -> bytes:
        return generate_latest(self.registry)
