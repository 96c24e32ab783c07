"""`nmt serve`: translation over HTTP (FastAPI + uvicorn, the `serve` extra).

    POST /translate  {"text": ["A man.", ...], "beam": 4, "nbest": 1, "lenpen": 0.6}
                     -> {"translations": ["Ein Mann.", ...]} (with nbest > 1 also "nbest": per
                        sentence its hypotheses with "text", "score" and "log_prob")
    GET /health      -> {"status": "ok", "requests": R, "searches": S}
    GET /config      -> the model's architecture, text settings and vocabulary sizes

Requests that arrive together are translated together: a batcher thread takes the first waiting
request, waits up to --batch-window-ms for more with the same search options, up to
--batch-words source words, and translates them in one call (translator.py), so throughput under
concurrency approaches `nmt translate` on a file. A bad request, or one that asks more than the
server's --max-* limits, gets a 4xx with a one-line reason, and the server keeps serving. SIGTERM
(or Ctrl-C) gives the requests in flight --drain-seconds to finish, answers 503 to the rest, and
stops on time.
"""

import asyncio
import json
import queue
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from nmt_cli.config import SearchConfig, ServeConfig, TranslateConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import reason
from nmt_cli.records import translations_record
from nmt_cli.search import SearchInterrupted
from nmt_cli.translator import Translator, model_search

OPTIONS = ("beam", "nbest", "lenpen", "max_len_a", "max_len_b")


class BadRequest(ValueError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass
class Job:
    search: SearchConfig
    lines: list[str]
    done: Future = field(default_factory=Future)


def parse(body: Any, config: ServeConfig, defaults: SearchConfig = SearchConfig()) -> tuple[SearchConfig, list[str]]:
    """The search options and sentences of a /translate body (the others: `defaults`, the model's,
    their length within the server's --max-output-tokens); BadRequest names what is wrong, and what
    exceeds a limit of the server (its --max-* options) names the limit."""
    if not isinstance(body, dict) or not isinstance(body.get("text"), list):
        raise BadRequest(400, 'the body must be a JSON object with "text": a list of sentences')
    unknown = sorted(set(body) - {"text", *OPTIONS})
    if unknown:
        raise BadRequest(400, f"unknown option {unknown[0]!r} (known: text, {', '.join(OPTIONS)})")
    lines = body["text"]
    if len(lines) > config.max_sentences:
        raise BadRequest(413, f"{len(lines)} sentences, more than the server's --max-sentences {config.max_sentences}")
    for number, line in enumerate(lines, start=1):
        if not isinstance(line, str) or "\n" in line:
            raise BadRequest(400, f"sentence {number}: not a string of one line")
        if len(line) > config.max_chars:
            raise BadRequest(413, f"sentence {number}: {len(line)} characters, more than the server's "
                                  f"--max-chars {config.max_chars}")
    options = {key: body[key] for key in OPTIONS if key in body}
    integers = {f.name for f in fields(SearchConfig) if f.type == "int"}
    for key, value in options.items():
        wanted, kind = ((int,), "an integer") if key in integers else ((int, float), "a number")
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise BadRequest(400, f"{key}: {json.dumps(value)} is not {kind}")
    try:
        base = {**asdict(defaults), "max_len_b": min(defaults.max_len_b, config.max_output_tokens)}
        search = SearchConfig(**{**base, **options, "max_len": config.max_output_tokens})
    except ValueError as e:
        raise BadRequest(400, str(e)) from None
    check_cost(search, len(lines), config)
    return search, lines


def check_cost(search: SearchConfig, sentences: int, config: ServeConfig) -> None:
    """Refuse a request that would hold the translation thread longer than the server allows."""
    if search.beam > config.max_beam:
        raise BadRequest(400, f"beam {search.beam}: more than the server's --max-beam {config.max_beam}")
    if search.max_len_b > config.max_output_tokens:
        raise BadRequest(400, f"max_len_b {search.max_len_b}: more than the server's --max-output-tokens "
                              f"{config.max_output_tokens}")
    if sentences * search.beam > config.max_hypotheses:
        raise BadRequest(413, f"{sentences} sentences x beam {search.beam}: more than the server's "
                              f"--max-hypotheses {config.max_hypotheses}")


class ShuttingDown(Exception):
    """The server stopped translating (SIGTERM) before it could answer."""


DRAIN_MARGIN_SECONDS = 0.5  # of --drain-seconds, to answer before uvicorn ends the connections


class Batcher:
    """One thread translating the waiting requests, those with the same search options together.
    Draining (SIGTERM), it goes on until a deadline, then stops its search and answers the rest
    with ShuttingDown."""

    def __init__(self, translator: Translator, config: ServeConfig) -> None:
        self.translator, self.config = translator, config
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.held: deque[Job | None] = deque()  # taken from the queue, waiting for their options' turn
        self.requests = self.searches = 0
        self.deadline: float | None = None
        self.thread = threading.Thread(target=self._loop, name="nmt-batcher", daemon=True)
        self.thread.start()

    def submit(self, search: SearchConfig, lines: list[str]) -> Future:
        job = Job(search, lines)
        self.requests += 1
        self.queue.put(job)
        return job.done

    def drain(self, seconds: float) -> None:
        """Translate what is waiting for at most `seconds` (less a margin); then answer ShuttingDown."""
        self.deadline = time.monotonic() + max(0.0, seconds - DRAIN_MARGIN_SECONDS)
        self.translator.generator.models.deadline = self.deadline  # a search stops there

    def close(self) -> None:
        self.queue.put(None)
        wait = None if self.deadline is None else max(0.0, self.deadline - time.monotonic()) + 1.0
        self.thread.join(wait)  # a daemon: a search stuck in one long step does not hold the exit

    def _loop(self) -> None:
        while (first := self.held.popleft() if self.held else self.queue.get()) is not None:
            group = [job for job in [first, *self._gather(first)] if job.done.set_running_or_notify_cancel()]
            if not group:
                continue
            try:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    raise ShuttingDown
                records = self.translate([line for job in group for line in job.lines], first.search)
            except Exception as e:  # noqa: BLE001 (the requests fail, the server keeps serving)
                error = ShuttingDown() if isinstance(e, SearchInterrupted) else e
                for job in group:
                    job.done.set_exception(error)
                continue
            self.searches += 1
            start = 0
            for job in group:
                job.done.set_result(records[start:start + len(job.lines)])
                start += len(job.lines)

    def translate(self, lines: list[str], search: SearchConfig) -> list[dict[str, Any]]:
        """The JSON record of each line's translations."""
        _, found = self.translator.search(lines, search)
        return [translations_record(k + 1, [self.translator.translation(h) for h in hyps])
                for k, hyps in enumerate(found)]

    def _gather(self, first: Job) -> list[Job]:
        """The requests with `first`'s options that arrive within the window, up to --batch-words."""
        group: list[Job] = []
        words = sum(len(line.split()) for line in first.lines)
        deadline = time.monotonic() + self.config.batch_window_ms / 1000
        while words < self.config.batch_words and (wait := deadline - time.monotonic()) > 0:
            try:
                job = self.queue.get(timeout=wait)
            except queue.Empty:
                break
            if job is None or job.search != first.search:
                self.held.append(job)  # None too: the loop ends after the held jobs
                if job is None:
                    break
                continue
            group.append(job)
            words += sum(len(line.split()) for line in job.lines)
        return group


def create_app(translator: Translator, config: ServeConfig, batcher: Batcher) -> Any:
    """The FastAPI application of `nmt serve`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.requests import ClientDisconnect

    app = FastAPI(title="nmt-cli", on_shutdown=[batcher.close])
    model = translator.bundle

    @app.post("/translate")
    async def translate(request: Request) -> Any:
        try:
            search, lines = parse(read_json(await request.body()), config, translator.config.search)
            if batcher.deadline is not None:
                raise ShuttingDown
            records = await asyncio.wrap_future(batcher.submit(search, lines))
        except ClientDisconnect:
            return Response(status_code=499)  # nobody to answer
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        except NmtError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        except ShuttingDown:
            return JSONResponse({"error": "the server is shutting down (SIGTERM) and could not translate this "
                                          "within its --drain-seconds; send it again to another server"},
                                status_code=503)
        answer: dict[str, Any] = {"translations": [r["translation"] for r in records]}
        if search.nbest > 1:
            answer["nbest"] = [[{k: h[k] for k in ("text", "score", "log_prob")} for h in r["nbest"]]
                               for r in records]
        return answer

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok" if batcher.deadline is None else "draining", "requests": batcher.requests,
                "searches": batcher.searches}

    @app.get("/config")
    async def model_config() -> dict[str, Any]:
        return {"model_config": model.model.config.to_dict(), "text_config": model.text.to_dict(),
                "src_vocab_size": len(model.src_vocab), "tgt_vocab_size": len(model.tgt_vocab)}

    return app


def read_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise BadRequest(400, "the body is not JSON") from None
    except RecursionError:
        raise BadRequest(400, "the body is JSON nested too deeply") from None


def check_address(host: str, port: int) -> None:
    """Refuse, in one line, an address this process cannot listen on (unknown, in use, not ours)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NmtError(f"--host {host}: no such address ({reason(e)})") from None
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise NmtError(f"{host}:{port}: cannot listen there ({reason(e)}); choose another --host or --port") from None


def serve(bundles: list, config: ServeConfig, device: Any, dtype: Any) -> None:
    """Run the server until SIGTERM or Ctrl-C; requests in flight get --drain-seconds to finish."""
    try:
        import fastapi  # noqa: F401 (create_app's; checked here, before anything starts)
        import uvicorn
    except ImportError:
        raise NmtError("nmt serve needs FastAPI and uvicorn: pip install 'nmt-cli[serve]'") from None
    check_address(config.host, config.port)
    translator = Translator(bundles, TranslateConfig(max_tokens=config.max_tokens,
                                                     search=model_search(bundles[0], {})), device, dtype)
    batcher = Batcher(translator, config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if batcher.deadline is None:
                batcher.drain(config.drain_seconds)
            super().handle_exit(sig, frame)

    app = create_app(translator, config, batcher)
    print(f"nmt serve: http://{config.host}:{config.port} ({device}, {str(dtype).removeprefix('torch.')})",
          flush=True)
    server = Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                   timeout_graceful_shutdown=config.drain_seconds))
    try:
        server.run()
    except KeyboardInterrupt:  # the signal that stopped it, raised again once it has shut down
        pass
