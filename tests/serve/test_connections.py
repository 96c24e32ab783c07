"""The server's guard on its connections (connections.py): a request that does not arrive whole
in --read-timeout is cut off (408 once begun), connections past --max-connections are answered
503, a flood of slow clients past the open-file limit leaves the server serving and its log short,
and a message repeated is logged once."""

import logging
import resource
import signal
import socket
import time

import pytest
from conftest import request, serving

from nmt_cli.errors import NmtError
from nmt_cli.serve import connections
from nmt_cli.serve.connections import Once, connection_cap


def connect(url: str) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10)
    client.settimeout(10)
    return client


def answer(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := client.recv(4096):
        received += chunk
    return received


def attempt(url: str) -> int | None:
    """The status of a translation request; None when the server closed the connection before it was sent."""
    try:
        return request(url + "/translate", {"text": ["a b"]})[0]
    except OSError:
        return None


def stop(process, log) -> str:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    return log.read_text()


@pytest.mark.slow
def test_a_request_that_does_not_arrive_whole_in_time_is_cut_off(tmp_path):
    _, url, process = serving(tmp_path, "--read-timeout", 1)
    idle, headers, body = connect(url), connect(url), connect(url)
    headers.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
    body.sendall(b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"text"')
    start = time.monotonic()
    assert answer(idle) == b""  # nothing begun: closed without a word
    late = answer(headers)
    assert late.startswith(b"HTTP/1.1 408 ") and b"--read-timeout 1 seconds" in late
    assert answer(body) == b""  # the body begun: the request is dropped
    assert time.monotonic() - start < 8  # 1 s, and time for a loaded machine
    for client in (idle, headers, body):
        client.close()
    with connect(url) as client:  # after an answer, the next request on the connection has its time too
        client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        assert answer(client).count(b"HTTP/1.1 ") == 2  # 200, then 408
    assert request(url + "/translate", {"text": ["a b"]})[0] == 200
    assert "Traceback" not in stop(process, tmp_path / "serve.log")


@pytest.mark.slow
def test_connections_past_max_connections_are_answered_503(tmp_path):
    _, url, process = serving(tmp_path, "--max-connections", 3)
    time.sleep(0.5)  # the start's health checks have closed their connections
    held = [connect(url) for _ in range(3)]
    time.sleep(0.3)
    with connect(url) as extra:
        refused = answer(extra)
    assert refused.startswith(b"HTTP/1.1 503 ") and b"--max-connections 3 connections open" in refused
    for client in held:
        client.close()
    time.sleep(0.3)
    assert request(url + "/translate", {"text": ["a b"]})[0] == 200
    assert "Traceback" not in stop(process, tmp_path / "serve.log")


@pytest.mark.slow
def test_a_flood_of_slow_clients_past_the_open_file_limit_leaves_the_server_serving(tmp_path):
    """600 clients that begin a request and never end it, against an open-file limit of 200: those
    over the connection cap are refused, the rest cut off after --read-timeout, then others are
    served; the log says each thing once, in one line."""
    _, url, process = serving(tmp_path, "--read-timeout", 2, files=200)
    flood = []
    for _ in range(600):
        try:
            client = connect(url)
            client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
            flood.append(client)
        except OSError:
            pass  # refused or reset: the server is full
    deadline = time.monotonic() + 60  # the waves of the flood cut off, one --read-timeout each
    while (status := attempt(url)) != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status == 200
    for client in flood:
        client.close()
    log = stop(process, tmp_path / "serve.log")
    assert "warning: at most 136 connections open at once, not --max-connections 512: the open-file limit is 200" \
        in log
    assert "Traceback" not in log and len(log.splitlines()) < 10, log[-3000:]


@pytest.mark.slow
def test_repeated_garbage_is_logged_once(tmp_path):
    _, url, process = serving(tmp_path)
    for _ in range(30):
        with connect(url) as client:
            client.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert answer(client).startswith(b"HTTP/1.1 400 ")
    assert stop(process, tmp_path / "serve.log").count("Invalid HTTP request received.") == 1


def test_once_lets_a_message_through_once_a_period_then_says_how_many_were_held(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(connections.time, "monotonic", lambda: now[0])
    once = Once()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, "x", 1, message, None, None)

    passed = [once.filter(r := record("Invalid HTTP request received.")) for _ in range(100)]
    assert passed == [True] + [False] * 99 and once.filter(record("another thing"))
    now[0] += connections.LOG_PERIOD_SECONDS
    assert once.filter(r := record("Invalid HTTP request received."))
    assert r.getMessage() == "Invalid HTTP request received. [and 99 more like it in the last 60 s]"


def test_the_connection_cap_raises_the_open_file_limit_or_stays_below_it(monkeypatch):
    limits, warned = {}, []
    monkeypatch.setattr(resource, "setrlimit", lambda kind, value: limits.update(set=value))
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1024, 4096))
    assert connection_cap(2000, warned.append) == 2000 and limits["set"] == (2064, 4096) and not warned
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1024, 1024))
    assert connection_cap(2000, warned.append) == 960
    assert warned == ["warning: at most 960 connections open at once, not --max-connections 2000: the open-file "
                      "limit is 1024 (ulimit -n)"]
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (50, 50))
    with pytest.raises(NmtError, match=r"the open-file limit \(50, ulimit -n\) leaves no room for connections: "
                                       "raise it to 76 or more"):
        connection_cap(12, warned.append)
