"""The connections of `nmt serve`, guarded against clients that hold them: at most
--max-connections open at once, below the open-file limit (the next are answered 503 and closed),
each given --read-timeout seconds to send a whole request (then closed: 408 if one had begun),
each body read no further than --max-body-bytes (`BodyCap`), and a log that says a thing once a
minute, not once per connection (asyncio logs every failed accept, up to the listen backlog's
count per turn of its loop, when open files run out).
"""

import json
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmt_cli.errors import NmtError

SPARE_FILES = 64  # open files left for the process: the listening socket, the log, the event loop's
LOG_PERIOD_SECONDS = 60.0


def connection_cap(wanted: int, warn: Any) -> int:
    """How many connections may be open at once: `wanted`, the open-file limit raised to hold
    them where its hard limit allows, else fewer (said by `warn`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    cap = wanted if soft == resource.RLIM_INFINITY else min(wanted, soft - SPARE_FILES)
    if cap < 1:
        raise NmtError(f"the open-file limit ({soft}, ulimit -n) leaves no room for connections: raise it to "
                       f"{needed} or more")
    if cap < wanted:
        warn(f"warning: at most {cap} connections open at once, not --max-connections {wanted}: the open-file "
             f"limit is {soft} (ulimit -n)")
    return cap


def response(status: int, reason: str, error: str) -> bytes:
    """An HTTP answer that closes its connection, with a JSON error as every answer of the server."""
    body = json.dumps({"error": error}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


def guarded_http(max_connections: int, read_timeout: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) with the connection cap and the read timeout."""
    full = response(503, "Service Unavailable", f"the server has its --max-connections {max_connections} "
                                                "connections open; try again later")
    late = response(408, "Request Timeout", f"the request did not arrive whole within the server's "
                                            f"--read-timeout {read_timeout:g} seconds")

    class GuardedH11Protocol(H11Protocol):
        timer: Any = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                transport.write(full)
                transport.close()
                return
            super().connection_made(transport)
            self._start_clock()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.transport is None:
                return  # refused in connection_made: uvicorn never knew it
            self._stop_clock()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
                self._stop_clock()  # the request arrived whole (or the connection ends)

        def on_response_complete(self) -> None:
            self._start_clock()  # for the next request on this connection
            super().on_response_complete()

        def _start_clock(self) -> None:
            self._stop_clock()
            self.timer = self.loop.call_later(read_timeout, self._timed_out)

        def _stop_clock(self) -> None:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

        def _timed_out(self) -> None:
            self.timer = None
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                self.transport.write(late)  # headers begun, not ended; with the body begun, the app sees a disconnect
            self.transport.close()

    return GuardedH11Protocol


TOO_LARGE = "nmt.body_too_large"  # in a request's scope: the --max-body-bytes that BodyCap stopped at


class BodyCap:
    """ASGI middleware: a request's body is read no further than `limit` bytes. Where Content-Length
    declares more, or the body grows past it (chunked), its reader hears that nothing more comes
    (as from a client gone away) and the request's scope says why (TOO_LARGE), so a body too large
    costs the server at most `limit` bytes. (A disconnect, not an exception: starlette's middleware
    would wrap an exception of `receive` in an ExceptionGroup.)"""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        received = 0

        async def capped() -> dict[str, Any]:
            nonlocal received
            if TOO_LARGE not in scope and not (declared.isdigit() and int(declared) > self.limit):
                message = await receive()
                received += len(message.get("body", b""))
                if received <= self.limit:
                    return message
            scope[TOO_LARGE] = self.limit
            return {"type": "http.disconnect"}

        await self.app(scope, capped, send)


class Once(logging.Filter):
    """Lets each message through once per LOG_PERIOD_SECONDS; the next one to pass says how
    many like it were held back."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage().split("\n", 1)[0][:200])
        now = time.monotonic()
        last, held = self.seen.get(key, (-LOG_PERIOD_SECONDS, 0))
        if now - last < LOG_PERIOD_SECONDS:
            self.seen[key] = (last, held + 1)
            return False
        if len(self.seen) > 10000:
            self.seen.clear()  # bounded, whatever is logged
        self.seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} [and {held} more like it in the last {now - last:.0f} s]"
        return True


def log_loop_error(loop: Any, context: dict[str, Any]) -> None:
    """An error of the event loop (a failed accept when open files run out, ...) in one line of
    asyncio's log, not a traceback."""
    error = context.get("exception")
    logging.getLogger("asyncio").error("%s%s", context["message"], f": {error}" if error else "")


def log_once() -> None:
    """Put `Once` on the loggers of the server (uvicorn's) and of its event loop (asyncio's)."""
    once = Once()
    for name in ("asyncio", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(once)
