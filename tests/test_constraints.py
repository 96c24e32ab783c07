"""Terminology (constraints.py): the progress on constraints against a plain loop, and the
constrained beam search: every phrase in every output, no phrase to avoid, sentences with
different constraints batched as searched alone."""

import random

import pytest
import torch
from builders import random_model, sources

from nmt_cli.config import SearchConfig
from nmt_cli.constraints import Terms
from nmt_cli.search import Ensemble, beam_search

CPU = torch.device("cpu")


def met_by_a_plain_loop(phrases: list[list[int]], output: list[int]) -> int:
    """How many constraint tokens `output` has met, by the module's rules written out: a phrase
    under way goes on with its next token or is left (its tokens not met); otherwise a token that
    begins a phrase not met begins the first such phrase."""
    met = [[False] * len(p) for p in phrases]
    current, at = None, 0
    for token in output:
        if current is not None and phrases[current][at] == token:
            met[current][at] = True
            at += 1
            if at == len(phrases[current]):
                current = None
            continue
        if current is not None:
            met[current] = [False] * len(phrases[current])
            current = None
        for j, phrase in enumerate(phrases):
            if not met[j][0] and phrase[0] == token:
                met[j][0] = True
                current, at = (j, 1) if len(phrase) > 1 else (None, 0)
                break
    return sum(map(sum, met))


@pytest.mark.parametrize("seed", range(4))
def test_progress_is_what_a_plain_loop_counts(seed):
    rng = random.Random(seed)
    phrases = [[rng.randrange(4, 8) for _ in range(rng.randrange(1, 4))] for _ in range(3)]
    outputs = [[rng.randrange(4, 8) for _ in range(12)] for _ in range(30)]
    terms = Terms([phrases], [[]], CPU)
    terms.start(1, len(outputs))
    for step in range(12):
        tokens = torch.tensor([[o[step] for o in outputs]])
        scores = torch.zeros(1, len(outputs))  # one candidate per row: the row's own next token
        terms.choose(scores, tokens, torch.tensor([0]), len(outputs))
        met, _ = terms.candidates
        terms.advance(torch.arange(len(outputs)).unsqueeze(0))
        assert met[0].sum(-1).tolist() == [met_by_a_plain_loop(phrases, o[: step + 1]) for o in outputs]


def contains(output: list[int], phrase: list[int]) -> bool:
    return any(output[i:i + len(phrase)] == phrase for i in range(len(output) - len(phrase) + 1))


@pytest.mark.parametrize("beam", [1, 4])
def test_every_phrase_in_every_output_none_avoided_and_batches_as_alone(beam):
    rng = random.Random(beam)
    vocab = 16
    model = random_model(vocab, 2, scale=3.0)
    rows = [[rng.randrange(4, vocab) for _ in range(rng.randrange(1, 8))] for _ in range(12)]
    include = [[[rng.randrange(4, vocab) for _ in range(rng.randrange(1, 3))] for _ in range(n % 4)]
               for n in range(len(rows))]
    avoid = [[[rng.choice([t for t in range(4, vocab) if all(t not in p for p in phrases)])]] if n % 3 == 0 else []
             for n, phrases in enumerate(include)]  # a token that no phrase of the sentence holds
    config = SearchConfig(beam=beam, max_len_a=1.0, max_len_b=12)
    plain = beam_search(Ensemble([model]), sources(rows, vocab), config)
    found = beam_search(Ensemble([model]), sources(rows, vocab), config, terms=Terms(include, avoid, CPU))
    for n, (hyps, phrases, banned) in enumerate(zip(found, include, avoid)):
        output = hyps[0].tokens
        assert all(contains(output, p) for p in phrases), (output, phrases)
        assert not any(contains(output, p) for p in banned), (output, banned)
        alone = beam_search(Ensemble([model]), sources([rows[n]], vocab), config,
                            terms=Terms([phrases], [banned], CPU))[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        assert alone[0].score == pytest.approx(hyps[0].score, abs=1e-4)
    assert sum(a[0].tokens != b[0].tokens for a, b in zip(found, plain)) >= len(rows) // 2  # constraints at work
    unconstrained = [n for n, (phrases, banned) in enumerate(zip(include, avoid)) if not phrases and not banned]
    assert all(found[n][0].tokens == plain[n][0].tokens for n in unconstrained)


def test_a_constraint_that_does_not_fit_the_length_limit_still_gives_an_output():
    model = random_model(12, 3, scale=3.0)
    config = SearchConfig(beam=3, max_len_a=0.0, max_len_b=2)
    terms = Terms([[[5, 6, 7, 8]]], [[]], CPU)
    (hyps,) = beam_search(Ensemble([model]), sources([[4, 5]], 12), config, terms=terms)
    assert hyps and len(hyps[0].tokens) <= 2


def test_terms_from_the_api_the_command_line_and_the_server(tmp_path):
    """Phrases as raw text, segmented as in running text, per line; lines with and without
    phrases batched together give what each gives alone (the fairseq bug class)."""
    import signal

    from click.testing import CliRunner
    from conftest import request, serving, tiny_checkpoint

    from nmt_cli.cli import main
    from nmt_cli.translator import Translator

    model = tiny_checkpoint(tmp_path / "m.pt", seed=6)
    lines = ["a b c", "d e", "f g h i", "j", "k l m"]
    include = [["p o", "c"], [], ["o"], ["n m", "l"], []]
    avoid = [[], ["a"], [], [], ["b c"]]
    translator = Translator.load(model, device="cpu", beam=4, max_len_b=10)
    found = translator.translate(lines, constraints=include, avoid=avoid)
    for output, phrases, banned in zip(found, include, avoid):
        assert all(contains(output.split(), p.split()) for p in phrases), (output, phrases)
        assert not any(contains(output.split(), p.split()) for p in banned), (output, banned)
    alone = [translator.translate([line], constraints=[p], avoid=[a])[0] for line, p, a in zip(lines, include, avoid)]
    assert alone == found
    tsv = "".join("\t".join([line, *phrases]) + "\n" for line, phrases in zip(lines, include))
    flags = ["--constraints", "--beam", "4", "--max-len-b", "10", "--device", "cpu", "--avoid", "b c"]
    result = CliRunner().invoke(main, ["translate", "-m", str(model), *flags], input=tsv)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == translator.translate(lines, constraints=include, avoid=[["b c"]] * 5)
    for flags, message in ((["--constraints", "--prefix"], "--constraints applies only without --prefix"),
                           (["--avoid", "x", "--sampling"], "--avoid applies only without --sampling")):
        refused = CliRunner().invoke(main, ["translate", "-m", str(model), *flags], input="a\n")
        assert refused.exit_code == 2 and message in refused.output
    _, url, process = serving(tmp_path, model=model)
    try:
        status, answer = request(url + "/translate", {"text": lines, "constraints": include, "avoid": avoid,
                                                      "beam": 4, "max_len_b": 10})
        assert status == 200 and answer["translations"] == found
        status, answer = request(url + "/translate", {"text": lines, "constraints": include[:2]})
        assert status == 400 and "2 lists of constraints for 5 sentences" in answer["error"]
        status, answer = request(url + "/translate", {"text": lines, "avoid": avoid, "sampling": True})
        assert status == 400 and "avoid apply to beam search" in answer["error"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_a_phrase_the_vocabulary_lacks_or_too_long_a_line_of_them_is_warned_once(tmp_path):
    from conftest import tiny_checkpoint

    from nmt_cli.translator import Translator

    warnings = []
    translator = Translator.load(tiny_checkpoint(tmp_path / "m.pt"), device="cpu", max_len_a=0.0, max_len_b=3,
                                 warn=warnings.append)
    found = translator.translate(["a b", "c", "d"], constraints=[["zz9"], ["a b c d e"], ["zz8", "e f g h"]])
    assert len(found) == 3
    assert warnings == ["warning: line 1: the phrase 'zz9' has a token the model's vocabulary lacks: left out "
                        "(warned once)",
                        "warning: line 2: its constraints (5 tokens) do not fit its output's length limit (3): it is "
                        "translated without some (warned once)"]
