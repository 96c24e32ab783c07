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
--rate-limit decide who may ask (access.py), --cors-origin which browser pages; the client's
address is the connection's unless --forwarded-allow-ips names a proxy to take it from.

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
from typing import Any

from nmt_cli.config import device_for
from nmt_cli.decode.engine import Engine, model_search
from nmt_cli.device import select, tune
from nmt_cli.errors import NmtError
from nmt_cli.files import reason
from nmt_cli.run_config import RunConfig, ServeConfig
from nmt_cli.serve.access import Keys
from nmt_cli.serve.batcher import IDLE_WAIT_SECONDS, Batcher
from nmt_cli.serve.pairs import load_pairs, load_shortlists


def log_requests() -> None:
    """--access-log: the line of each request on stderr, with its time."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger("nmt.access").addHandler(handler)
    logging.getLogger("nmt.access").setLevel(logging.INFO)


def check_address(host: str, port: int) -> None:
    """Refuse, in one line, an address this process cannot listen on (unknown, in use, not ours)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # IPv4 or IPv6 (::1, ::)
    except socket.gaierror as e:
        raise NmtError(f"--host {host}: no such address ({reason(e)})") from None
    try:
        with socket.create_server((host, port), family=family):
            pass
    except OSError as e:
        raise NmtError(f"{host}:{port}: cannot listen there ({reason(e)}); choose another --host or --port") from None


def serve(models: list[str], config: ServeConfig) -> None:
    """Run the server until SIGTERM or Ctrl-C; requests in flight get --drain-seconds to finish."""
    try:
        import fastapi_offline  # noqa: F401 (the routes'; checked here, before anything starts)
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise NmtError(f"nmt serve needs its extra ({e.name} is missing): pip install 'nmt-cli[serve]'") from None
    from nmt_cli.serve.connections import connection_cap, guarded_http, log_loop_error, log_once
    from nmt_cli.serve.metrics import Metrics
    from nmt_cli.serve.routes import Service, create_app

    check_address(config.host, config.port)
    device, dtype = select(device_for(config.device, config.quantize), config.precision)
    tune(device, config.threads)
    keys = Keys(config.api_keys) if config.api_keys is not None else None
    metrics_keys = Keys(config.metrics_key) if config.metrics_key is not None else None
    connections = connection_cap(config.max_connections, warn=lambda message: print(message, file=sys.stderr))
    pairs = load_pairs(models)
    shortlists = load_shortlists(config.shortlist, pairs)
    engines = {pair: Engine(bundles, RunConfig(max_tokens=config.max_tokens, search=model_search(bundles[0], {}),
                                               quantize=config.quantize), device, dtype, shortlist=shortlists.get(pair))
               for pair, bundles in pairs.items()}
    metrics = Metrics(waiting=lambda: batcher.waiting_requests())
    batcher = Batcher(config, engines.values(), metrics.searched)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(log_loop_error)
            await super().startup(sockets)

    app = create_app(Service(engines, config, batcher, metrics, keys, metrics_keys))
    server = Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                   proxy_headers=bool(config.forwarded_allow_ips),
                                   forwarded_allow_ips=list(config.forwarded_allow_ips) or None,
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
    reloaded = [each for each in (keys, metrics_keys) if each is not None]
    if reloaded:
        signal.signal(signal.SIGHUP, lambda sig, frame: [print(each.reload(), file=sys.stderr, flush=True)
                                                         for each in reloaded])
    log_once()
    if config.access_log:
        log_requests()
    host = f"[{config.host}]" if ":" in config.host else config.host  # an IPv6 address in a URL
    print(f"nmt serve: http://{host}:{config.port} ({device}, {str(dtype).removeprefix('torch.')}; "
          f"{', '.join(f'{source}-{target}' for source, target in engines)})", flush=True)
    web = threading.Thread(target=listen, name="nmt-http", daemon=True)
    web.start()
    batcher.run()  # on this thread, which loaded the model
    while web.is_alive():  # a bounded wait, so that a second Ctrl-C's handler runs (batcher.IDLE_WAIT_SECONDS)
        web.join(IDLE_WAIT_SECONDS)
    if not server.started:
        raise NmtError(f"{config.host}:{config.port}: the server could not start (the line above says why)")
