"""`nmt serve` on loopback: concurrent requests answered as `nmt translate` answers them (and
batched together), bad requests refused with a one-line reason while the server keeps serving,
SIGTERM letting a request in flight finish."""

import json
import re
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
from conftest import request, serving, tiny_checkpoint

from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.translate import translate_lines
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.run_config import RunConfig, TranslateConfig

LINES = ["a b c d", "p o n m l k", "", "e", "f g h i j k l m n o p a b c", "c c c", "h a", "b b a a"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model, url, process = serving(tmp_path_factory.mktemp("serve"), "--batch-window-ms", 200, "--max-sentences", 20,
                                "--max-hypotheses", 300, "--max-source-tokens", 40)
    yield model, url
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def expected(model, lines, attention=False, prefix=False, **search):
    """`nmt translate --format jsonl`'s records of `lines` (with `prefix`: SOURCE<TAB>PREFIX lines)."""
    engine = Engine([load_bundle(model)], RunConfig(SearchConfig(**search)), torch.device("cpu"))
    config = TranslateConfig(format="jsonl", attention=attention, prefix=prefix)
    return [json.loads(record) for record in translate_lines(engine, lines, config=config)]


@pytest.mark.slow
def test_prefixes_and_alignments_as_translate_gives_them(server):
    model, url = server
    prefixes = ["", "b", "c d", "", "", "", "a", ""]
    status, answer = request(url + "/translate", {"text": LINES, "prefixes": prefixes, "attention": True})
    records = expected(model, [f"{line}\t{prefix}" for line, prefix in zip(LINES, prefixes)], attention=True,
                       prefix=True)
    assert status == 200 and answer["translations"] == [r["translation"] for r in records]
    assert answer["translations"][2] == "c d"  # an empty source with a prefix: the prefix alone
    for alignment, record in zip(answer["alignments"], records):
        if "attention" not in record:
            assert alignment is None or not record["nbest"]
            continue
        assert alignment["src_tokens"] == record["attention"]["src_tokens"]
        assert alignment["tgt_tokens"] == record["attention"]["tgt_tokens"]
        torch.testing.assert_close(torch.tensor(alignment["weights"]), torch.tensor(record["attention"]["weights"]),
                                   atol=1e-4, rtol=0)
    status, answer = request(url + "/translate", {"text": ["a", "b"], "prefixes": ["c"]})
    assert status == 400 and answer["error"] == "1 prefixes for 2 sentences: one each"


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
    status, answer = request(url + "/translate", {"text": LINES[:3], "mbr": 4, "mbr_utility": "bleu"})
    assert answer["translations"] == [r["translation"] for r in expected(model, LINES[:3], mbr=4, mbr_utility="bleu")]
    assert request(url + "/config")[1]["src_vocab_size"] == 20


def test_the_api_is_described_and_its_docs_need_no_internet(server):
    _, url = server
    api = request(url + "/openapi.json")[1]
    body = api["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    beam = SearchConfig.__dataclass_fields__["beam"].metadata
    assert body["required"] == ["text"] and body["additionalProperties"] is False
    assert body["properties"]["beam"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": beam["max"]}
    assert body["properties"]["beam"]["description"] == beam["help"]
    answer = api["paths"]["/translate"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["$ref"] == "#/components/schemas/TranslateResponse"
    page = urllib.request.urlopen(url + "/docs").read().decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert assets and all(asset.startswith("/") for asset in assets), assets  # none from a CDN
    assert all(urllib.request.urlopen(url + asset).status == 200 for asset in assets)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """The samples of /metrics by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_seeded_samples_repeat_whatever_is_translated_beside_them(server):
    _, url = server
    body = {"text": LINES, "sampling": True, "seed": 5, "nbest": 2}
    alone = request(url + "/translate", body)[1]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: request(url + "/translate", b)[1],
                                [body, {"text": LINES}, {"text": LINES, "sampling": True}, body]))
    assert answers[0] == answers[3] == alone and len(alone["nbest"][0]) == 2


def test_metrics_count_requests_sentences_tokens_and_searches(server):
    _, url = server
    before = scrape(url)
    assert request(url + "/translate", {"text": ["a b c", "", "d e"]})[0] == 200
    assert request(url + "/translate", {"text": ["a"], "beam": 0})[0] == 400
    after = scrape(url)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("nmt_requests_total", path="/translate", status="200") == 1
    assert grew("nmt_requests_total", path="/translate", status="400") == 1
    assert grew("nmt_sentences_total") == 3 and grew("nmt_source_tokens_total") == 5
    assert grew("nmt_target_tokens_total") >= 2 and grew("nmt_search_sentences_count") == 1
    assert grew("nmt_request_seconds_count", path="/translate") == 2
    assert after[("nmt_waiting_requests", ())] == 0


@pytest.mark.parametrize("body, status, reason", [
    (b"{not json", 400, "the body is not JSON"),
    ({"lines": ["a"]}, 400, 'a JSON object with "text"'),
    ({"text": ["a"], "beem": 4}, 400, "unknown option 'beem'"),
    ({"text": ["a"] * 21}, 413, "21 sentences, more than the server's --max-sentences 20"),
    ({"text": ["a\\nb"]}, 400, "sentence 1: not one line"),
    ({"text": ["a", 7]}, 400, "sentence 2: input should be a valid string"),
    ({"text": ["a"], "beam": "4"}, 400, "beam: input should be a valid integer"),
    ({"text": ["a"], "beam": True}, 400, "beam: input should be a valid integer"),
    ({"text": ["a"], "stopping": "never"}, 400, "stopping: input should be 'early', 'heuristic' or 'onmt'"),
    ({"text": ["a"], "beam": 2, "nbest": 3}, 400, "--nbest 3 is larger than --beam 2"),
    ({"text": ["a"], "beam": 20000, "max_len_b": 1000}, 400, "beam: input should be less than or equal to 1024"),
    ({"text": ["a"], "temperature": 0.5}, 400, "temperature applies only with --sampling"),
    ({"text": ["a"], "beam": 17}, 400, "beam 17: more than the server's --max-beam 16"),
    ({"text": ["a"], "max_len_b": 1000}, 400, "max_len_b 1000: more than the server's --max-output-tokens 256"),
    ({"text": ["a"] * 20, "beam": 16}, 413, "20 sentences x beam 16: more than the server's --max-hypotheses 300"),
    ({"text": ["a"], "mbr": 17}, 400, "mbr 17: more than the server's --max-beam 16"),
    ({"text": ["a"] * 19, "mbr": 16, "mbr_candidates": "sample"}, 413, "19 sentences x mbr 16: more than"),
    ({"text": ["a"], "sampling": True, "nbest": 17}, 400, "nbest 17: more than the server's --max-beam 16"),
    ({"text": ["a"], "mbr": 4, "beam": 5}, 400, "beam applies only to beam search"),
    ({"text": ["a"], "mbr": 4, "mbr_candidates": "sample", "constraints": [["b"]]}, 400,
     "constraints apply to beam search, not with sampling"),
    ({"text": ["a b c d e f g h i j"] * 5}, 413, "sentences 1 to 5 come to 50 source tokens, more than the "
                                               "server's --max-source-tokens 40"),
    ({"text": ["a"], "max_len_b": 10**30}, 400, "max_len_b=1000000000000000000000000000000: must be <="),
    (b'{"text": ["a"], "lenpen": NaN}', 400, "lenpen: input should be a finite number"),
    (b'{"text": ["a"], "max_len_a": Infinity}', 400, "max_len_a: input should be a finite number"),
    (b"[" * 100000, 400, "the body is JSON nested too deeply"),
])
@pytest.mark.slow
def test_bad_requests_get_a_reason_and_the_server_keeps_serving(server, body, status, reason):
    _, url = server
    if isinstance(body, dict) and body.get("text") == ["a\\nb"]:
        body = {"text": ["a\nb"]}
    code, answer = request(url + "/translate", body)
    assert code == status and reason in answer["error"] and "\n" not in answer["error"]
    assert request(url + "/translate", {"text": ["a b"]})[0] == 200


@pytest.mark.slow
def test_sigterm_lets_the_request_in_flight_finish(tmp_path):
    model, url, process = serving(tmp_path, "--batch-window-ms", 1500)  # a request waits 1.5 s in the batcher
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(request, url + "/translate", {"text": LINES})
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        status, body = answer.result(timeout=60)
    assert status == 200 and len(body["translations"]) == len(LINES)
    assert process.wait(timeout=60) == 0


@pytest.mark.slow
def test_a_short_drain_answers_a_long_request_in_time_and_exits_on_time(tmp_path):
    """SIGTERM 1 s into a request that takes far longer, with --drain-seconds 2: the client gets a
    503 with a reason within the drain time, the server exits on time, and its log holds no traceback."""
    model, url, process = serving(tmp_path, "--drain-seconds", 2, "--max-output-tokens", 10000, "--max-hypotheses",
                                100000, "--max-beam", 64)
    long = {"text": [" ".join("abcdefghijklmnop")] * 1000, "beam": 64, "max_len_b": 10000, "max_len_a": 100}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(request, url + "/translate", long)
        time.sleep(1.0)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        status, body = answer.result(timeout=60)
        answered = time.monotonic() - signalled
    assert process.wait(timeout=60) == 0
    exited = time.monotonic() - signalled
    assert status == 503 and "shutting down" in body["error"] and answered < 2.5, (status, body, answered)
    assert exited < 5, exited
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
def test_a_client_that_goes_away_leaves_no_traceback(tmp_path):
    _, url, process = serving(tmp_path)
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as client:  # promises a body it never sends
        client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"text\"")
        time.sleep(0.5)
    time.sleep(0.5)
    assert request(url + "/translate", {"text": ["a b"]})[0] == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_an_ipv6_address_is_served_and_the_access_log_escapes_a_path(tmp_path):
    """--host ::1 listens (it was refused: 'Address family for hostname not supported'); a path
    holding a terminal's escape sequence is logged escaped, not raw."""
    _, url, process = serving(tmp_path, "--access-log", host="::1")
    assert url.startswith("http://[::1]:") and request(url + "/translate", {"text": ["a b"]})[0] == 200
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url + "/%1b[31mred", timeout=60)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    log = (tmp_path / "serve.log").read_text()
    assert "nmt serve: http://[::1]:" in log and " GET /\\x1b[31mred 404 " in log and "\x1b" not in log


@pytest.mark.slow
def test_an_unknown_host_is_refused_in_one_line(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    done = subprocess.run([sys.executable, "-m", "nmt_cli", "serve", "-m", str(model), "--host", "no-such-host.invalid",
                           "--device", "cpu"], capture_output=True, text=True, timeout=120)
    # the resolver's reason differs between machines ("Name or service not known"; without a DNS
    # server, "Temporary failure in name resolution")
    assert done.returncode == 1 and re.fullmatch(r"Error: --host no-such-host\.invalid: no such address \([^\n]+\)",
                                                 done.stderr.strip()), done.stderr


@pytest.mark.slow
def test_a_port_in_use_is_refused_in_one_line(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "nmt_cli", "serve", "-m", str(model), "--port", str(port),
                               "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert f"127.0.0.1:{port}: cannot listen there (Address already in use)" in done.stderr
