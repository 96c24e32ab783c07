"""The HTTP application of `nmt serve` (FastAPI; its /docs need no internet: fastapi-offline): one
route per path, each reading the `Service` it answers from off the application, and one
middleware that decides who may ask (access.py) and counts and logs every answer; no body is read
past --max-body-bytes (connections.BodyCap).

    POST /translate  nmt-cli's body (schemas.py) or LibreTranslate's (`q`: libretranslate.py)
    POST /detect     LibreTranslate's language detection (the languages served)
    GET /health, /config, /languages, /metrics, /docs, and / (the page to try it, page.html)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.requests import ClientDisconnect

from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.records import Translation
from nmt_cli.errors import NmtError
from nmt_cli.pages import page
from nmt_cli.run_config import ServeConfig
from nmt_cli.serve.access import Keys, RateLimit, bearer, is_open
from nmt_cli.serve.batcher import Batcher, RequestTooLarge, ShuttingDown
from nmt_cli.serve.connections import TOO_LARGE, BodyCap
from nmt_cli.serve.libretranslate import detected, is_libretranslate, parse_libretranslate
from nmt_cli.serve.metrics import Metrics
from nmt_cli.serve.pairs import NoSuchPair, Pair, choose, languages
from nmt_cli.serve.schemas import (
    BadRequest,
    ErrorResponse,
    Health,
    TranslateRequest,
    TranslateResponse,
    options,
    parse,
    read_body,
    search_config,
)
from nmt_cli.version import __version__

SHUTTING_DOWN = ("the server is shutting down (SIGTERM) and could not translate this within its --drain-seconds; "
                 "send it again to another server")
ACCESS_LOG = logging.getLogger("nmt.access")


@dataclass
class Service:
    """What the routes answer from: the engine of each language pair served, the server's options,
    the batcher that translates, the metrics, and the API keys (None: no keys asked for)."""

    engines: dict[Pair, Engine]
    config: ServeConfig
    batcher: Batcher
    metrics: Metrics
    keys: Keys | None = None
    metrics_keys: Keys | None = None
    limit: RateLimit | None = field(init=False)
    failures: RateLimit = field(init=False)

    def __post_init__(self) -> None:
        self.limit = RateLimit(self.config.rate_limit) if self.config.rate_limit else None
        self.failures = RateLimit(self.config.failed_key_limit)  # per address, with keys

    def pair_of(self, source: str | None, target: str | None) -> Pair:
        try:
            return choose(list(self.engines), source, target)
        except NoSuchPair as e:
            raise BadRequest(400, str(e)) from None

    async def translations(self, pair: Pair, given: dict[str, Any], lines: list[str],
                           prefixes: list[str] | None = None, attention: bool = False,
                           constraints: list[list[str]] | None = None, avoid: list[list[str]] | None = None
                           ) -> tuple[SearchConfig, list[list[Translation]]]:
        """The search of `given` options and the translations of `lines` by the model of `pair`."""
        engine = self.engines[pair]
        search = search_config(given, len(lines), self.config, engine.config.search)
        if self.batcher.deadline is not None:
            raise ShuttingDown
        return search, await asyncio.wrap_future(self.batcher.submit(engine, search, lines, prefixes, attention,
                                                                     constraints, avoid))

    async def answer(self, body: Any) -> dict[str, Any]:
        """The answer to a /translate body: nmt-cli's, or LibreTranslate's (`q`)."""
        if is_libretranslate(body):
            asked = parse_libretranslate(body, self.config)
            pair = self.pair_of(asked.source, asked.target)
            _, found = await self.translations(pair, asked.options(self.engines[pair].config.search.beam), asked.lines)
            return asked.answer(found, pair[0])
        ours = parse(body, self.config)
        pair = self.pair_of(ours.source, ours.target)
        search, found = await self.translations(pair, options(ours), ours.text, ours.prefixes, bool(ours.attention),
                                                ours.constraints, ours.avoid)
        result: dict[str, Any] = {"translations": [hyps[0].text if hyps else "" for hyps in found]}
        if search.nbest > 1:
            result["nbest"] = [[{"text": h.text, "score": round(h.score, 6), "log_prob": round(h.log_prob, 6)}
                                for h in hyps] for hyps in found]
        if ours.attention:
            result["alignments"] = [hyps[0].alignment if hyps else None for hyps in found]
        if ours.constraints:  # a phrase not held is said, not dropped in silence
            result["missing"] = [hyps[0].missing if hyps else self.engines[pair].missing(phrases, [], k)
                                 for k, (phrases, hyps) in enumerate(zip(ours.constraints, found), start=1)]
        return result

    async def refusal(self, request: Request) -> Response | None:
        """The answer to a request that may not go on (a missing or unknown key, too many of either
        from its address, too many requests, a body too large to read for its key), else None."""
        key = bearer(request.headers.get("authorization"))
        address = request.client.host if request.client else "-"
        if request.url.path == "/metrics":
            return self.scrape_refusal(key, address)
        if is_open(request.url.path):
            return None
        if self.keys is not None:
            if wait := self.failures.waiting(address):
                return self.too_many_failures(wait)
            if key is None and request.method == "POST":
                try:
                    key = await body_key(request)  # LibreTranslate's clients send it in the body
                except BadRequest as e:
                    return JSONResponse({"error": str(e)}, status_code=e.status)
            if key not in self.keys:
                self.failures.wait(address)
                return JSONResponse({"error": "a missing or unknown API key: send the header Authorization: Bearer "
                                              "KEY"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if self.limit and (wait := self.limit.wait(key or address)):
            return too_many(wait, f"more than the server's --rate-limit {self.config.rate_limit} requests a minute")
        return None

    def scrape_refusal(self, key: str | None, address: str) -> Response | None:
        """/metrics: open to Prometheus (no --api-keys key), or behind --metrics-key's keys, a wrong
        one counted against the address as a wrong API key is."""
        if self.metrics_keys is None:
            return None
        if wait := self.failures.waiting(address):
            return self.too_many_failures(wait)
        if key in self.metrics_keys:
            return None
        self.failures.wait(address)
        return JSONResponse({"error": "/metrics asks for one of the server's --metrics-key keys: send the header "
                                      "Authorization: Bearer KEY"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    def too_many_failures(self, wait: int) -> JSONResponse:
        return too_many(wait, f"more than the server's --failed-key-limit {self.config.failed_key_limit} missing or "
                              "unknown keys a minute from this address")


def printable(text: str) -> str:
    """`text` with its control characters escaped (\\x1b), as a log line carries a client's path:
    no terminal escape sequence reaches whoever reads the log."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def too_many(wait: int, what: str) -> JSONResponse:
    return JSONResponse({"error": f"{what}; try again in {wait} s"}, status_code=429,
                        headers={"Retry-After": str(wait)})


async def raw_body(request: Request) -> bytes:
    """A request's body as it came, within --max-body-bytes (else BadRequest 413)."""
    try:
        return await request.body()
    except ClientDisconnect:
        if (limit := request.scope.get(TOO_LARGE)) is not None:
            raise BadRequest(413, f"a body of more than the server's --max-body-bytes {limit:,} bytes") from None
        raise


async def body_of(request: Request) -> Any:
    """A request's body, read (`raw_body`) and parsed (JSON or a form)."""
    return read_body(await raw_body(request), request.headers.get("content-type"))


async def body_key(request: Request) -> str | None:
    """The `api_key` of a body (LibreTranslate's), if it has one; BadRequest 413 past --max-body-bytes."""
    try:
        raw = await raw_body(request)
    except ClientDisconnect:
        return None
    try:
        body = read_body(raw, request.headers.get("content-type"))
    except BadRequest:  # a body that is not one: no key in it
        return None
    key = body.get("api_key") if isinstance(body, dict) else None
    return key if isinstance(key, str) else None


def service_of(request: Request) -> Service:
    return request.app.state.service


async def guard(request: Request, call_next: Any) -> Any:
    """Keys and the rate limit first; then the request's answer counted (and logged with --access-log)."""
    service, start, path = service_of(request), time.monotonic(), request.url.path
    response = await service.refusal(request) or await call_next(request)
    seconds = time.monotonic() - start
    service.metrics.answered(path if path in request.app.state.paths else "other", response.status_code, seconds)
    if service.config.access_log:
        client = f"{request.client.host}:{request.client.port}" if request.client else "-"
        ACCESS_LOG.info("%s %s %s %d %.1f ms", client, printable(request.method), printable(path),
                        response.status_code, 1000 * seconds)
    return response


async def translate(request: Request) -> Any:
    """Translate sentences; requests that arrive together share a search."""
    try:
        return await service_of(request).answer(await body_of(request))
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


async def detect(request: Request) -> Any:
    """LibreTranslate's language detection: the languages the server translates from."""
    try:
        return detected(await body_of(request), sorted({source for source, _ in service_of(request).engines}))
    except ClientDisconnect:
        return Response(status_code=499)
    except BadRequest as e:
        return JSONResponse({"error": str(e)}, status_code=e.status)


async def home(request: Request) -> Response:
    """A page to try the server: a text box, the language pair, a button."""
    return Response(request.app.state.page, media_type="text/html; charset=utf-8")


async def served_languages(request: Request) -> list[dict[str, Any]]:
    """The language pairs, as LibreTranslate lists them: each source with its targets."""
    return languages(list(service_of(request).engines))


async def health(request: Request) -> dict[str, Any]:
    """Whether the server takes requests (draining: it stops), and how many it took."""
    batcher = service_of(request).batcher
    return {"status": "ok" if batcher.deadline is None else "draining", "requests": batcher.requests,
            "searches": batcher.searches}


async def model_config(request: Request, source: str | None = None, target: str | None = None) -> Any:
    """The architecture, text settings and vocabulary sizes of the model of a pair."""
    service = service_of(request)
    try:
        model = service.engines[service.pair_of(source, target)].bundle
    except BadRequest as e:
        return JSONResponse({"error": str(e)}, status_code=e.status)
    return {"model_config": model.model.config.to_dict(), "text_config": model.text.to_dict(),
            "src_vocab_size": len(model.src_vocab), "tgt_vocab_size": len(model.tgt_vocab)}


async def prometheus(request: Request) -> Response:
    metrics = service_of(request).metrics
    return Response(metrics.text(), media_type=metrics.content_type)


def create_app(service: Service) -> FastAPIOffline:
    """The application of `nmt serve`, answering from `service`."""
    app = FastAPIOffline(title="nmt-cli", version=__version__, redoc_url=None,
                         description="Translation with a Transformer (nmt-cli's `nmt serve`); LibreTranslate's "
                                     "API too (`q` for `text`).")
    answers: dict[int | str, dict[str, Any]] = {200: {"model": TranslateResponse}, **{
        status: {"model": ErrorResponse} for status in (400, 401, 413, 422, 429, 503)}}
    body = {"required": True, "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}}}
    app.add_api_route("/translate", translate, methods=["POST"], responses=answers, openapi_extra={"requestBody": body})
    app.add_api_route("/detect", detect, methods=["POST"], responses={400: {"model": ErrorResponse}})
    app.add_api_route("/", home, include_in_schema=False)
    app.add_api_route("/languages", served_languages)
    app.add_api_route("/health", health, response_model=Health)
    app.add_api_route("/config", model_config, responses={400: {"model": ErrorResponse}})
    app.add_api_route("/metrics", prometheus, include_in_schema=False)
    app.state.service = service
    app.state.page = page("nmt_cli.serve", "page.html")
    app.state.paths = {route.path for route in app.routes}  # the label of a request to any other path: "other"
    app.middleware("http")(guard)
    app.add_middleware(BodyCap, limit=service.config.max_body_bytes)  # outside the guard: its body reads too
    if service.config.cors_origin:  # outermost: a preflight is answered before the keys are asked for
        app.add_middleware(CORSMiddleware, allow_origins=list(service.config.cors_origin),
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    return app
