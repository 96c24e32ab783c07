"""`nmt serve` on loopback: concurrent requests answered as `nmt translate` answers them (and
batched together), bad requests refused with a one-line reason while the server keeps serving,
SIGTERM letting a request in flight finish."""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import tiny_checkpoint

from nmt_cli.checkpoint import load_bundle
from nmt_cli.config import SearchConfig, TranslateConfig
from nmt_cli.translate import Translator

LINES = ["a b c d", "p o n m l k", "", "e", "f g h i j k l m n o p a b c", "c c c", "h a", "b b a a"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: object = None) -> tuple[int, dict]:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start(tmp_path, *options, model=None, device="cpu"):
    """`nmt serve` of `model` (default: an untrained tiny one) on a free port, once it answers."""
    model = model or tiny_checkpoint(tmp_path / "m.pt", seed=3)
    port = free_port()
    log = tmp_path / "serve.log"  # a file, not a pipe nobody reads
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "nmt_cli", "serve", "-m", str(model), "--port", str(port),
                                    "--device", device, "--threads", "1", *map(str, options)], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if request(url + "/health")[0] == 200:
                return model, url, process
        except OSError:
            time.sleep(0.2)
    process.kill()
    process.wait()
    raise AssertionError(f"the server did not start: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model, url, process = start(tmp_path_factory.mktemp("serve"), "--batch-window-ms", 200, "--max-sentences", 20)
    yield model, url
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def expected(model, lines, **search):
    translator = Translator([load_bundle(model)], TranslateConfig(SearchConfig(**search), format="jsonl"),
                            torch.device("cpu"))
    return [json.loads(record) for record in translator.translate_lines(lines)]


def test_concurrent_requests_are_batched_and_answered_as_translate_does(server):
    model, url = server
    bodies = [{"text": LINES[k:k + 3], "beam": 3, "max_len_b": 4} for k in range(len(LINES))] * 2
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: request(url + "/translate", body), bodies))
    for body, (status, answer) in zip(bodies, answers):
        assert status == 200
        assert answer["translations"] == [r["translation"] for r in expected(model, body["text"], beam=3,
                                                                                 max_len_b=4)]
    health = request(url + "/health")[1]
    assert health["requests"] >= len(bodies) and health["searches"] < health["requests"]  # shared searches
    status, answer = request(url + "/translate", {"text": ["a b c"], "beam": 3, "nbest": 2})
    assert [h["text"] for h in answer["nbest"][0]] == [h["text"] for h in expected(model, ["a b c"], beam=3,
                                                                                   nbest=2)[0]["nbest"]]
    assert request(url + "/config")[1]["src_vocab_size"] == 20


@pytest.mark.parametrize("body, status, reason", [
    (b"{not json", 400, "the body is not JSON"),
    ({"lines": ["a"]}, 400, 'a JSON object with "text"'),
    ({"text": ["a"], "beem": 4}, 400, "unknown option 'beem'"),
    ({"text": ["a"] * 21}, 413, "21 sentences, more than the server's --max-sentences 20"),
    ({"text": ["a\\nb"]}, 400, "sentence 1: not a string of one line"),
    ({"text": ["a"], "beam": "4"}, 400, 'beam: "4" is not an integer'),
    ({"text": ["a"], "beam": 2, "nbest": 3}, 400, "--nbest 3 is larger than --beam 2"),
])
def test_bad_requests_get_a_reason_and_the_server_keeps_serving(server, body, status, reason):
    _, url = server
    if isinstance(body, dict) and body.get("text") == ["a\\nb"]:
        body = {"text": ["a\nb"]}
    code, answer = request(url + "/translate", body)
    assert code == status and reason in answer["error"] and "\n" not in answer["error"]
    assert request(url + "/translate", {"text": ["a b"]})[0] == 200


def test_sigterm_lets_the_request_in_flight_finish(tmp_path):
    model, url, process = start(tmp_path, "--batch-window-ms", 1500)  # a request waits 1.5 s in the batcher
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(request, url + "/translate", {"text": LINES})
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        status, body = answer.result(timeout=60)
    assert status == 200 and len(body["translations"]) == len(LINES)
    assert process.wait(timeout=60) == 0


def test_a_port_in_use_is_refused_in_one_line(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "nmt_cli", "serve", "-m", str(model), "--port", str(port),
                               "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert f"127.0.0.1:{port}: cannot listen there (Address already in use)" in done.stderr
