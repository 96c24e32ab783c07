"""Who may use the server (access.py): the bearer key of a header, the keys of a file (read again,
or kept when the file cannot be read), a rate limit as a bucket per client; and on a server, 401
without a key, 429 with Retry-After past the limit, SIGHUP reading the keys again, the open paths,
failed keys limited per address, no body read before the key is known or past --max-body-bytes,
X-Forwarded-For taken only from --forwarded-allow-ips."""

import signal
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from conftest import request, serving

from nmt_cli.errors import NmtError
from nmt_cli.serve import access
from nmt_cli.serve.access import Keys, RateLimit, bearer, is_open


def test_bearer_takes_the_key_of_a_bearer_header_only():
    assert bearer("Bearer abc") == bearer("bearer  abc ") == "abc"
    assert bearer(None) is bearer("") is bearer("Basic abc") is bearer("Bearer ") is None


def test_keys_of_a_file_read_again_or_kept(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("# ours\nabc\n\n  def  \n")
    keys = Keys(path)
    assert "abc" in keys and "def" in keys and "# ours" not in keys and None not in keys and "ab" not in keys
    path.write_text("ghi\n")
    assert keys.reload() == f"{path}: 1 API keys read" and "ghi" in keys and "abc" not in keys
    path.write_text("\n# none\n")
    assert keys.reload() == f"{path}: no API keys in it (one per line); the 1 keys read before stay"
    assert "ghi" in keys
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(NmtError, match="cannot read the API keys \\(not UTF-8 text\\)"):
        Keys(path)


def test_keys_whose_file_went_away_stay(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("abc\n")
    keys = Keys(path)
    path.unlink()
    assert keys.reload() == (f"{path}: cannot read a file of API keys (No such file or directory); the 1 keys "
                             "read before stay") and "abc" in keys


def test_a_key_no_authorization_header_can_carry_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("caf\xe9\n# \u043a\u043b\u044e\u0447\n\u043a\u043b\u044e\u0447\n")
    with pytest.raises(NmtError, match=f"^{path}, line 3: a key that an Authorization header cannot carry "):
        Keys(path)
    path.write_text("ok\na\x7fb\n")
    with pytest.raises(NmtError, match=f"^{path}, line 2: "):
        Keys(path)


def test_the_rate_limit_forgets_clients_whose_buckets_are_full_again(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(access.time, "monotonic", lambda: now[0])
    limit = RateLimit(60)
    for client in range(10001):
        limit.wait(str(client))
    now[0] += 1.0  # one token back for each: full again
    assert limit.wait("new") == 0 and list(limit.buckets) == ["new"]


def test_the_rate_limit_allows_a_burst_then_one_request_per_period(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(access.time, "monotonic", lambda: now[0])
    limit = RateLimit(3)  # 3 a minute: one every 20 s
    assert [limit.wait("a") for _ in range(4)] == [0, 0, 0, 20]
    assert limit.wait("b") == 0  # another client has a bucket of its own
    now[0] += 15
    assert limit.wait("a") == 5
    now[0] += 5
    assert limit.wait("a") == 0 and limit.wait("a") == 20


def test_the_rate_limit_says_the_wait_without_counting(monkeypatch):
    monkeypatch.setattr(access.time, "monotonic", lambda: 100.0)
    limit = RateLimit(2)
    assert [limit.waiting("a") for _ in range(3)] == [0, 0, 0]
    limit.wait("a"), limit.wait("a")
    assert limit.waiting("a") == 30 and limit.waiting("b") == 0


def test_open_paths():
    assert all(map(is_open, ["/", "/health", "/docs", "/openapi.json", "/static-offline-docs/swagger-ui.css"]))
    assert not any(map(is_open, ["/translate", "/metrics", "/config", "/healthz"]))


def post(url: str, key: str | None, origin: str | None = None, forwarded: str | None = None) -> tuple[int, Any]:
    """The status and headers (any case) of a translation request with `key` from a page of `origin`
    (and a proxy's X-Forwarded-For: `forwarded`)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}),
               **({"Origin": origin} if origin else {}), **({"X-Forwarded-For": forwarded} if forwarded else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/translate", data=b'{"text": ["a b"]}',
                                                           headers=headers), timeout=60) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def status_of(url: str, key: str | None, length: int | None = None, chunks: tuple[bytes, ...] = ()) -> int:
    """The status a POST /translate gets with `key` in its header, its body `length` declared (and
    none of it sent) or sent as `chunks`: an answer before the body is whole is one that did not
    read it (the client waits at most 10 s)."""
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            + (f"Authorization: Bearer {key}\r\n" if key else "")
            + (f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n") + "\r\n")
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head.encode() + body)
        return int(connection.recv(4096).split(b" ", 2)[1])


@pytest.mark.slow
def test_a_server_with_keys_and_limits(tmp_path):
    (tmp_path / "keys.txt").write_text("first\nbig\n")
    _, url, process = serving(tmp_path, "--api-keys", tmp_path / "keys.txt", "--rate-limit", 2, "--access-log",
                              "--failed-key-limit", 4, "--max-body-bytes", 2000)
    assert post(url, None)[0] == post(url, "wrong")[0] == 401  # 2 failed keys from 127.0.0.1
    assert request(url + "/health")[0] == 200  # open
    assert urllib.request.urlopen(url + "/metrics", timeout=60).status == 200  # Prometheus scrapes without a key
    assert [post(url, "first")[0] for _ in range(2)] == [200, 200]
    status, headers = post(url, "first")
    assert status == 429 and 1 <= int(headers["Retry-After"]) <= 30
    for key in ("big", None):  # read by the route; by the guard for a LibreTranslate api_key
        assert status_of(url, key, length=300_000_000) == 413  # declared: nothing read
        assert status_of(url, key, chunks=(b" " * 1500, b" " * 1500)) == 413  # read as far as the cap
    (tmp_path / "keys.txt").write_text("second\n")
    process.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert post(url, "first")[0] == 401 and post(url, "second")[0] == 200  # 3 failed keys
    assert status_of(url, "wrong", length=1000) == 401  # the 4th, from the header, the body never sent
    status, headers = post(url, "second")  # the address may not try more keys, the right one either
    assert status == 429 and 1 <= int(headers["Retry-After"]) <= 15
    assert post(url, "second", forwarded="10.1.2.3")[0] == 429  # no proxy trusted: X-Forwarded-For is not its address
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    log = (tmp_path / "serve.log").read_text()
    assert f"{tmp_path}/keys.txt: 1 API keys read" in log and "Traceback" not in log
    for status in (401, 413, 429, 200):
        assert f" POST /translate {status} " in log
    assert " GET /health 200 " in log


@pytest.mark.slow
def test_a_browser_page_of_an_allowed_origin_may_call_the_server(tmp_path):
    (tmp_path / "keys.txt").write_text("k\n")
    _, url, process = serving(tmp_path, "--cors-origin", "https://app.example", "--api-keys", tmp_path / "keys.txt",
                              "--forwarded-allow-ips", "127.0.0.1", "--failed-key-limit", 1)
    preflight = urllib.request.Request(url + "/translate", method="OPTIONS", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    with urllib.request.urlopen(preflight, timeout=60) as answer:  # no key needed for a preflight
        assert answer.status == 200 and answer.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "authorization" in answer.headers["Access-Control-Allow-Headers"].lower()
    status, headers = post(url, "k", origin="https://app.example")
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    status, headers = post(url, "k", origin="https://other.example")
    assert status == 200 and headers["Access-Control-Allow-Origin"] is None
    # behind a trusted proxy (--forwarded-allow-ips), the failed keys of each client address counted apart
    assert [post(url, "bad", forwarded="10.0.0.1")[0] for _ in range(2)] == [401, 429]
    assert post(url, "k", forwarded="10.0.0.2")[0] == post(url, "k")[0] == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
