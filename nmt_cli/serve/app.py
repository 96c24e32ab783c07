"""`nmt serve`: translation over HTTP (FastAPI + uvicorn, the `serve` extra).

    POST /translate  {"text": ["A man.", ...], "beam": 4, "nbest": 1, "lenpen": 0.6}
                     -> {"translations": ["Ein Mann.", ...]} (with nbest > 1 also "nbest": per
                        sentence its hypotheses with "text", "score" and "log_prob")
    GET /health      -> {"status": "ok", "requests": R, "searches": S}
    GET /config      -> the model's architecture, text settings and vocabulary sizes
    GET /metrics     -> Prometheus' text format (metrics.py)
    GET /docs        -> the API, described by /openapi.json (schemas.py)
    GET /languages   -> the language pairs, as LibreTranslate lists them (pairs.py)
    GET /            -> a page to try it (page.html)

LibreTranslate's `POST /translate` (`q`) is answered too (libretranslate.py). --api-keys and
--rate-limit decide who may ask (access.py), --cors-origin which browser pages.

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
import logging
import signal
import socket
import sys
import threading
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from nmt_cli.decode.engine import Engine, model_search
from nmt_cli.device import select, tune
from nmt_cli.errors import NmtError
from nmt_cli.files import reason
from nmt_cli.run_config import RunConfig, ServeConfig
from nmt_cli.serve.access import Keys, RateLimit, bearer, is_open
from nmt_cli.serve.batcher import IDLE_WAIT_SECONDS, Batcher, RequestTooLarge, ShuttingDown
from nmt_cli.serve.libretranslate import is_libretranslate, parse_libretranslate
from nmt_cli.serve.pairs import NoSuchPair, Pair, choose, languages, load_pairs, load_shortlists
from nmt_cli.serve.schemas import BadRequest, options, parse, read_body, search_config
from nmt_cli.version import __version__

if TYPE_CHECKING:
    from nmt_cli.serve.metrics import Metrics

SHUTTING_DOWN = ("the server is shutting down (SIGTERM) and could not translate this within its --drain-seconds; "
                 "send it again to another server")


def create_app(engines: dict[Pair, Engine], config: ServeConfig, batcher: Batcher, metrics: "Metrics",
               keys: Keys | None = None) -> Any:
    """The FastAPI application of `nmt serve`; its /docs need no internet (fastapi-offline)."""
    from fastapi import Request
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import JSONResponse, Response
    from fastapi_offline import FastAPIOffline
    from starlette.requests import ClientDisconnect

    from nmt_cli.serve.schemas import ErrorResponse, Health, TranslateRequest, TranslateResponse

    app = FastAPIOffline(title="nmt-cli", version=__version__, redoc_url=None,
                         description="Translation with a Transformer (nmt-cli's `nmt serve`); LibreTranslate's "
                                     "API too (`q` for `text`).")
    errors: dict[int | str, dict[str, Any]] = {status: {"model": ErrorResponse}
                                               for status in (400, 401, 413, 422, 429, 503)}
    limit = RateLimit(config.rate_limit) if config.rate_limit else None
    access = logging.getLogger("nmt.access")

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        """Keys and the rate limit first; then the request's answer counted (and logged with --access-log)."""
        start, path = time.monotonic(), request.url.path
        response = await refuse(request) or await call_next(request)
        seconds = time.monotonic() - start
        metrics.answered(path if path in routes else "other", response.status_code, seconds)
        if config.access_log:
            client = f"{request.client.host}:{request.client.port}" if request.client else "-"
            access.info("%s %s %s %d %.1f ms", client, request.method, path, response.status_code, 1000 * seconds)
        return response

    async def refuse(request: Request) -> Any:
        """The answer to a request that may not go on (a missing or unknown key, too many), else None."""
        if is_open(request.url.path):
            return None
        key = bearer(request.headers.get("authorization"))
        if key is None and keys is not None and request.method == "POST":
            key = await body_key(request)  # LibreTranslate's clients send it in the body
        if keys is not None and key not in keys:
            return JSONResponse({"error": "a missing or unknown API key: send the header Authorization: Bearer KEY"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        wait = limit.wait(key or (request.client.host if request.client else "-")) if limit is not None else 0
        if wait:
            return JSONResponse({"error": f"more than the server's --rate-limit {config.rate_limit} requests a "
                                          f"minute; try again in {wait} s"},
                                status_code=429, headers={"Retry-After": str(wait)})
        return None

    async def body_key(request: Request) -> str | None:
        try:
            body = read_body(await request.body(), request.headers.get("content-type"))
        except (BadRequest, ClientDisconnect):
            return None
        key = body.get("api_key") if isinstance(body, dict) else None
        return key if isinstance(key, str) else None

    def pair_of(source: str | None, target: str | None) -> Pair:
        try:
            return choose(list(engines), source, target)
        except NoSuchPair as e:
            raise BadRequest(400, str(e)) from None

    async def translations(pair: Pair, given: dict[str, Any], lines: list[str], prefixes: list[str] | None = None,
                           attention: bool = False, constraints: list[list[str]] | None = None,
                           avoid: list[list[str]] | None = None) -> tuple[Any, list]:
        """The search of `given` options and the translations of `lines` by the model of `pair`."""
        engine = engines[pair]
        search = search_config(given, len(lines), config, engine.config.search)
        if batcher.deadline is not None:
            raise ShuttingDown
        return search, await asyncio.wrap_future(batcher.submit(engine, search, lines, prefixes, attention,
                                                                constraints, avoid))

    async def answer(request: Request) -> Any:
        """The answer to a /translate body: nmt-cli's, or LibreTranslate's (`q`)."""
        body = read_body(await request.body(), request.headers.get("content-type"))
        if is_libretranslate(body):
            asked = parse_libretranslate(body, config)
            pair = pair_of(asked.source, asked.target)
            _, found = await translations(pair, asked.options(engines[pair].config.search.beam), asked.lines)
            return asked.answer(found, pair[0])
        ours = parse(body, config)
        search, found = await translations(pair_of(ours.source, ours.target), options(ours), ours.text,
                                           ours.prefixes, bool(ours.attention), ours.constraints, ours.avoid)
        result: dict[str, Any] = {"translations": [hyps[0].text if hyps else "" for hyps in found]}
        if search.nbest > 1:
            result["nbest"] = [[{"text": h.text, "score": round(h.score, 6), "log_prob": round(h.log_prob, 6)}
                                for h in hyps] for hyps in found]
        if ours.attention:
            result["alignments"] = [hyps[0].alignment if hyps else None for hyps in found]
        return result

    @app.post("/translate", responses={200: {"model": TranslateResponse}, **errors},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": TranslateRequest.model_json_schema()}}}})
    async def translate(request: Request) -> Any:
        """Translate sentences; requests that arrive together share a search."""
        try:
            return await answer(request)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody to answer
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        except RequestTooLarge as e:
            return JSONResponse({"error": str(e)}, status_code=413)
        except NmtError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        except ShuttingDown:
            return JSONResponse({"error": SHUTTING_DOWN}, status_code=503)

    page = (resources.files("nmt_cli.serve") / "page.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        """A page to try the server: a text box, the language pair, a button."""
        return Response(page, media_type="text/html; charset=utf-8")

    @app.get("/languages")
    async def served_languages() -> list[dict[str, Any]]:
        """The language pairs, as LibreTranslate lists them: each source with its targets."""
        return languages(list(engines))

    @app.get("/health", response_model=Health)
    async def health() -> dict[str, Any]:
        """Whether the server takes requests (draining: it stops), and how many it took."""
        return {"status": "ok" if batcher.deadline is None else "draining", "requests": batcher.requests,
                "searches": batcher.searches}

    @app.get("/config", responses={400: {"model": ErrorResponse}})
    async def model_config(source: str | None = None, target: str | None = None) -> Any:
        """The architecture, text settings and vocabulary sizes of the model of a pair."""
        try:
            model = engines[pair_of(source, target)].bundle
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        return {"model_config": model.model.config.to_dict(), "text_config": model.text.to_dict(),
                "src_vocab_size": len(model.src_vocab), "tgt_vocab_size": len(model.tgt_vocab)}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=metrics.content_type)

    routes = {route.path for route in app.routes}  # the label of a request to any other path: "other"
    if config.cors_origin:  # outermost: a preflight is answered before the keys are asked for
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origin), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    return app


def log_requests() -> None:
    """--access-log: the line of each request on stderr, with its time."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger("nmt.access").addHandler(handler)
    logging.getLogger("nmt.access").setLevel(logging.INFO)


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


def serve(models: list[str], config: ServeConfig) -> None:
    """Run the server until SIGTERM or Ctrl-C; requests in flight get --drain-seconds to finish."""
    try:
        import fastapi_offline  # noqa: F401 (create_app's; checked here, before anything starts)
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise NmtError(f"nmt serve needs its extra ({e.name} is missing): pip install 'nmt-cli[serve]'") from None
    from nmt_cli.serve.connections import connection_cap, guarded_http, log_loop_error, log_once
    from nmt_cli.serve.metrics import Metrics

    check_address(config.host, config.port)
    device, dtype = select(config.device, config.precision)
    tune(device, config.threads)
    keys = Keys(config.api_keys) if config.api_keys is not None else None
    connections = connection_cap(config.max_connections, warn=lambda message: print(message, file=sys.stderr))
    pairs = load_pairs(models)
    shortlists = load_shortlists(config.shortlist, pairs)
    engines = {pair: Engine(bundles, RunConfig(max_tokens=config.max_tokens, search=model_search(bundles[0], {})),
                            device, dtype, shortlist=shortlists.get(pair))
               for pair, bundles in pairs.items()}
    metrics = Metrics(waiting=lambda: batcher.waiting_requests())
    batcher = Batcher(config, engines.values(), metrics.searched)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(log_loop_error)
            await super().startup(sockets)

    app = create_app(engines, config, batcher, metrics, keys)
    server = Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                   timeout_graceful_shutdown=config.drain_seconds,
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
    if keys is not None:
        signal.signal(signal.SIGHUP, lambda sig, frame: print(keys.reload(), file=sys.stderr, flush=True))
    log_once()
    if config.access_log:
        log_requests()
    print(f"nmt serve: http://{config.host}:{config.port} ({device}, {str(dtype).removeprefix('torch.')}; "
          f"{', '.join(f'{source}-{target}' for source, target in engines)})", flush=True)
    web = threading.Thread(target=listen, name="nmt-http", daemon=True)
    web.start()
    batcher.run()  # on this thread, which loaded the model
    while web.is_alive():  # a bounded wait, so that a second Ctrl-C's handler runs (batcher.IDLE_WAIT_SECONDS)
        web.join(IDLE_WAIT_SECONDS)
    if not server.started:
        raise NmtError(f"{config.host}:{config.port}: the server could not start (the line above says why)")
