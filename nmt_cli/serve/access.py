"""Who may use `nmt serve`: API keys read from a file (again on SIGHUP), and a rate limit per key,
or per client address where there are no keys. The server's health, its page and its API
description stay open."""

import hashlib
import math
import time
from pathlib import Path

from nmt_cli.errors import NmtError
from nmt_cli.files import small_file

OPEN_PATHS = frozenset({"/", "/health", "/languages", "/docs", "/docs/oauth2-redirect", "/openapi.json"})
OPEN_PREFIX = "/static-offline-docs/"  # the assets of /docs
KEYS_BYTES = 1 << 20  # a file of keys, not data given by mistake


def is_open(path: str) -> bool:
    """Whether `path` is served without a key and without counting against the rate limit."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIX)


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


class Keys:
    """The API keys of a file, one per line (blank lines and `#` comments skipped), kept as digests."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digests = self._read()

    def __contains__(self, key: str | None) -> bool:
        return key is not None and hashlib.sha256(key.encode()).digest() in self.digests

    def reload(self) -> str:
        """Read the file again (SIGHUP); what happened, in one line: a file that cannot be read
        leaves the keys as they were."""
        try:
            self.digests = self._read()
        except NmtError as e:
            return f"{e}; the {len(self.digests)} keys read before stay"
        return f"{self.path}: {len(self.digests)} API keys read"

    def _read(self) -> frozenset[bytes]:
        try:
            lines = small_file(self.path, "a file of API keys", KEYS_BYTES).decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise NmtError(f"{self.path}: cannot read the API keys (not UTF-8 text)") from None
        keys = []
        for number, line in enumerate(lines, 1):
            key = line.strip()
            if key and not key.startswith("#"):
                if not key.isprintable() or max(map(ord, key)) > 0xFF:
                    raise NmtError(f"{self.path}, line {number}: a key that an Authorization header cannot carry "
                                   "(printable Latin-1 characters only)")
                keys.append(key)
        if not keys:
            raise NmtError(f"{self.path}: no API keys in it (one per line)")
        return frozenset(hashlib.sha256(key.encode()).digest() for key in keys)


class RateLimit:
    """At most `per_minute` requests a minute per client: a bucket each, full at first, refilled
    `per_minute` tokens a minute (so a burst of `per_minute` is allowed, then one every 60/N s)."""

    def __init__(self, per_minute: int) -> None:
        self.capacity, self.rate = float(per_minute), per_minute / 60.0
        self.buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when)

    def wait(self, client: str) -> int:
        """0 when `client` may send a request now (it is counted), else the seconds to wait."""
        now = time.monotonic()
        tokens = self._tokens(client, now)
        if tokens >= 1.0:
            self._forget_full(now)
            self.buckets[client] = (tokens - 1.0, now)
            return 0
        self.buckets[client] = (tokens, now)
        return self._seconds(tokens)

    def waiting(self, client: str) -> int:
        """What `wait` would say, without counting a request."""
        tokens = self._tokens(client, time.monotonic())
        return 0 if tokens >= 1.0 else self._seconds(tokens)

    def _tokens(self, client: str, now: float) -> float:
        tokens, when = self.buckets.get(client, (self.capacity, now))
        return min(self.capacity, tokens + (now - when) * self.rate)

    def _seconds(self, tokens: float) -> int:
        return max(1, math.ceil((1.0 - tokens) / self.rate))

    def _forget_full(self, now: float) -> None:
        """Drop the clients whose buckets are full again: memory bounded by the clients of a minute."""
        if len(self.buckets) > 10000:
            self.buckets = {client: (tokens, when) for client, (tokens, when) in self.buckets.items()
                            if tokens + (now - when) * self.rate < self.capacity}
