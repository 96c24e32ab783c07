"""--min-len, --no-repeat-ngram-size, --repetition-penalty (controls.py): the n-gram rule against
a plain loop, sampling under the controls, and the controls through the command line, the
Python API and the server. The beam search under them against the search written out:
test_search.py; against transformers' generate(): test_importer.py."""

import random
import signal

import pytest
import torch
from builders import random_model, sources
from click.testing import CliRunner
from conftest import request, serving, tiny_checkpoint

from nmt_cli.cli import main
from nmt_cli.config import SearchConfig
from nmt_cli.decode.controls import repeated_ngram_ends
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.sampling import sample
from nmt_cli.decode.translator import Translator


@pytest.mark.parametrize("n", [1, 2, 3])
def test_repeated_ngram_ends_are_what_a_plain_loop_finds(n):
    rng = random.Random(n)
    outputs = [[rng.randrange(4, 8) for _ in range(9)] for _ in range(20)]
    found = repeated_ngram_ends(torch.tensor(outputs), n, 8)
    for row, banned in zip(outputs, found.tolist()):
        ends = {row[i + n - 1] for i in range(len(row) - n + 1) if row[i:i + n - 1] == row[len(row) - n + 1:]}
        assert {t for t, is_banned in enumerate(banned) if is_banned} == ends


def has_repeated_ngram(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def test_samples_keep_the_minimum_length_and_repeat_no_ngram():
    model = random_model(8, 3, scale=1.0)  # a flat model over 4 symbols: unconstrained samples repeat
    rows = [[4, 5, 6], [7], [5, 5, 4, 6]]
    config = SearchConfig(sampling=True, nbest=16, max_len_a=0, max_len_b=12)
    free = sample(Ensemble([model]), sources(rows, 8), config, torch.Generator().manual_seed(0))
    assert any(len(h.tokens) < 3 for s in free for h in s) and any(has_repeated_ngram(h.tokens, 2)
                                                                   for s in free for h in s)
    controlled = SearchConfig(**{**config.to_dict(), "min_len": 3, "no_repeat_ngram_size": 2})
    samples = sample(Ensemble([model]), sources(rows, 8), controlled, torch.Generator().manual_seed(0))
    for h in (h for s in samples for h in s):
        assert len(h.tokens) >= 3 and not has_repeated_ngram(h.tokens, 2), h.tokens


def test_the_controls_from_the_command_line_the_api_and_the_server(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt", seed=5)
    lines = ["a b c", "d", "e f g h"]
    options = {"min_len": 6, "no_repeat_ngram_size": 1, "beam": 2, "max_len_b": 12}
    api = Translator.load(model, device="cpu").translate(lines, **options)
    for output in api:
        assert len(output.split()) >= 6 and len(set(output.split())) == len(output.split())  # no token twice
    plain = Translator.load(model, device="cpu").translate(lines, beam=2, max_len_b=12)
    assert api != plain
    flags = ["--min-len", 6, "--no-repeat-ngram-size", 1, "--beam", 2, "--max-len-b", 12, "--device", "cpu"]
    result = CliRunner().invoke(main, ["translate", "-m", str(model), *map(str, flags)], input="\n".join(lines) + "\n")
    assert result.exit_code == 0 and result.stdout.splitlines() == api, result.output
    penalized = Translator.load(model, device="cpu", repetition_penalty=3.0).translate(lines, beam=2, max_len_b=12)
    assert penalized != plain
    _, url, process = serving(tmp_path, model=model)
    try:
        status, answer = request(url + "/translate", {"text": lines, **options})
        assert status == 200 and answer["translations"] == api
        status, answer = request(url + "/translate", {"text": lines, "beam": 2, "max_len_b": 12,
                                                      "repetition_penalty": 3.0})
        assert status == 200 and answer["translations"] == penalized
        status, answer = request(url + "/translate", {"text": lines, "repetition_penalty": 0})
        assert status == 400 and "repetition_penalty" in answer["error"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
