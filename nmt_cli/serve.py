"""`nmt serve`: translation over HTTP (FastAPI + uvicorn, the `serve` extra).

    POST /translate  {"text": ["A man.", ...], "beam": 4, "nbest": 1, "lenpen": 0.6}
                     -> {"translations": ["Ein Mann.", ...]} (with nbest > 1 also "nbest": per
                        sentence its hypotheses with "text", "score" and "log_prob")
    GET /health      -> {"status": "ok", "requests": R, "searches": S}
    GET /config      -> the model's architecture, text settings and vocabulary sizes

Requests that arrive together are translated together (batcher.py): those with the same search
options share a search of up to --max-tokens source tokens, a larger request is cut into several,
and waiting requests take turns, so throughput under concurrency approaches `nmt translate` on a
file while a small request waits about one search. A bad request, or one that asks more than the
server's --max-* limits, gets a 4xx with a one-line reason, and the server keeps serving; a client
that holds a connection without sending a request is cut off (connections.py). SIGTERM (or
Ctrl-C) gives the requests in flight --drain-seconds to finish, answers 503 to the rest, and
stops on time.
"""

import asyncio
import json
import signal
import socket
import sys
import threading
from dataclasses import asdict, fields
from typing import Any

from nmt_cli.batcher import Batcher, RequestTooLarge, ShuttingDown
from nmt_cli.config import SearchConfig, ServeConfig, TranslateConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import reason
from nmt_cli.translator import Translator, model_search

OPTIONS = ("beam", "nbest", "lenpen", "max_len_a", "max_len_b")


class BadRequest(ValueError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


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


def create_app(translator: Translator, config: ServeConfig, batcher: Batcher) -> Any:
    """The FastAPI application of `nmt serve`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.requests import ClientDisconnect

    app = FastAPI(title="nmt-cli")
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
        except RequestTooLarge as e:
            return JSONResponse({"error": str(e)}, status_code=413)
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
    from nmt_cli.connections import connection_cap, guarded_http, log_loop_error, log_once

    check_address(config.host, config.port)
    connections = connection_cap(config.max_connections, warn=lambda message: print(message, file=sys.stderr))
    translator = Translator(bundles, TranslateConfig(max_tokens=config.max_tokens,
                                                     search=model_search(bundles[0], {})), device, dtype)
    batcher = Batcher(translator, config)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(log_loop_error)
            await super().startup(sockets)

    server = Server(uvicorn.Config(create_app(translator, config, batcher), host=config.host, port=config.port,
                                   log_level="warning", timeout_graceful_shutdown=config.drain_seconds,
                                   http=guarded_http(connections, config.read_timeout)))

    def stop(sig: int, frame: Any) -> None:
        """SIGTERM or Ctrl-C: drain, then stop (a second Ctrl-C: stop now)."""
        if batcher.deadline is None:
            batcher.drain(config.drain_seconds)
        server.handle_exit(sig, frame)

    def listen() -> None:
        try:
            server.run()
        finally:
            batcher.close()  # once the connections are answered, or when uvicorn could not start

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    log_once()
    print(f"nmt serve: http://{config.host}:{config.port} ({device}, {str(dtype).removeprefix('torch.')})",
          flush=True)
    web = threading.Thread(target=listen, name="nmt-http", daemon=True)
    web.start()
    batcher.run()  # on this thread, which loaded the model
    web.join()
    if not server.started:
        raise NmtError(f"{config.host}:{config.port}: the server could not start (the line above says why)")
