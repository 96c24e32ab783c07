"""The Python API: `Translator.load(path).translate(lines)` answers as `nmt translate` does; n-best,
prefixes, sampling, iteration in bounded memory, and scores of given targets that equal the
log-probabilities the search gives its hypotheses."""

import re

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_checkpoint

from nmt_cli import NmtError, Translator
from nmt_cli.cli import main

LINES = ["a b c d", "", "p o n m l k", "e", "f g h i j k l m n o p a b c", "c c c", "h a"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("api") / "m.pt", seed=3)


def cli(model_path, *flags, lines=LINES):
    result = CliRunner().invoke(main, ["translate", "-m", str(model_path), "--device", "cpu", *map(str, flags)],
                                input="".join(line + "\n" for line in lines))
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_translate_answers_as_the_command_line_does(model_path):
    translator = Translator.load(model_path, device="cpu")
    assert translator.translate(LINES) == cli(model_path)
    assert translator.translate(LINES, beam=2, lenpen=1.0, max_len_b=5) == cli(model_path, "--beam", 2, "--lenpen", 1,
                                                                                "--max-len-b", 5)
    ensemble = Translator.load(model_path, model_path, device="cpu", beam=3)  # search defaults at load
    assert ensemble.translate(LINES) == cli(model_path, "-m", model_path, "--beam", 3)


def test_one_line_in_gives_one_out_with_its_own_prefix_and_phrases(model_path):
    """A str is one line (fairseq hub's habit), not a list of characters; a list stays a list."""
    import nmt_cli

    translator = Translator.load(model_path, device="cpu", beam=3)
    assert translator.translate("p o n m l k") == translator.translate(["p o n m l k"])[0]
    assert translator.translate("") == ""
    assert translator.translate("a b c d", prefixes="a") == translator.translate(["a b c d"], prefixes=["a"])[0]
    assert (translator.translate("a b c d", constraints=["p o"], avoid=["a"])
            == translator.translate(["a b c d"], constraints=[["p o"]], avoid=[["a"]])[0])
    one = translator.hypotheses("c c c", nbest=2)
    assert isinstance(one, list) and all(isinstance(h, nmt_cli.Translation) for h in one)
    assert one == translator.hypotheses(["c c c"], nbest=2)[0]
    with pytest.raises(NmtError, match=r"^constraints: a list of phrases for one line, not a str \('p o'\)$"):
        translator.translate("a b c d", constraints="p o")
    assert repr(translator) == "Translator(1 model(s), cpu float32, beam 3, lenpen 0.6)"
    assert isinstance(translator.score(["a b"], ["b a"])[0], nmt_cli.Scored)


def test_what_is_not_a_line_or_an_option_is_refused_naming_it(model_path, tmp_path):
    """Wrong types are caught where they enter, in one NmtError naming the option or the line,
    not inside torch."""
    translator = Translator.load(model_path, device="cpu")
    for options, message in (({"beam": 4.0}, "beam=4.0: expected an integer"),
                             ({"beam": True}, "beam=True: expected an integer"),
                             ({"sampling": "yes"}, "sampling='yes': expected true or false"),
                             ({"lenpen": "1"}, "lenpen='1': expected a number")):
        with pytest.raises(NmtError, match=f"^{re.escape(message)}$"):
            translator.translate("a b", **options)
        with pytest.raises(NmtError, match=f"^{re.escape(message)}$"):
            Translator.load(model_path, device="cpu", **options)
    assert translator.translate("a b", lenpen=1) == translator.translate("a b", lenpen=1.0)  # an int is a number
    (tmp_path / "in.txt").write_text("a b\nc d\n")
    for lines, message in ((None, "lines: expected a list of str (or one str), got NoneType"),
                           (["a", None], "lines: line 2 is NoneType, not str"),
                           ([3], "lines: line 1 is int, not str")):
        with pytest.raises(NmtError, match=f"^{re.escape(message)}$"):
            translator.translate(lines)
    with open(tmp_path / "in.txt", "rb") as binary, pytest.raises(NmtError, match=r"^lines: line 1 is bytes, not str "
                                                                 r"\(open files in text mode"):
        list(translator.translate_iter(binary))
    with pytest.raises(NmtError, match="^lines: expected an iterable of lines .* got NoneType$"):
        list(translator.translate_iter(None))
    with pytest.raises(NmtError, match="^targets: line 1 is bytes, not str"):
        translator.score(["a b"], [b"b a"])
    for options, message in (({"prefixes": "a"}, "prefixes: expected a list of str, got str"),
                             ({"prefixes": [3]}, "prefixes: line 1 is int, not str"),
                             ({"constraints": ["a"]}, "constraints of line 1: expected a list of str, got str"),
                             ({"avoid": [[b"a"]]}, "avoid of line 1: phrase 1 is bytes, not str"),
                             ({"constraints": [["a"], ["b"]]}, "1 lines but 2 constraints")):
        with pytest.raises(NmtError, match=f"^{re.escape(message)}"):
            translator.translate(["a b"], **options)
    assert translator.translate(["a b"], avoid=[None]) == translator.translate(["a b"])  # None: no phrases


def test_a_seeded_call_samples_the_same_whatever_runs_beside_it(model_path):
    """Seeded sampling from several threads on one Translator: each call's seed gives the samples
    of that call alone (its own random stream); translate_iter's stream runs across its chunks."""
    from concurrent.futures import ThreadPoolExecutor

    translator = Translator.load(model_path, device="cpu", threads=1)
    lines = LINES * 5
    alone = {seed: translator.translate(lines, sampling=True, seed=seed) for seed in range(4)}
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda seed: (seed, translator.translate(lines, sampling=True, seed=seed)),
                                 [0, 1, 2, 3] * 3))
    assert all(samples == alone[seed] for seed, samples in together)
    assert len({tuple(samples) for samples in alone.values()}) == 4  # the seeds draw different samples
    chunked = list(translator.translate_iter(lines, chunk_lines=4, sampling=True, seed=0))
    assert chunked == list(translator.translate_iter(lines, chunk_lines=4, sampling=True, seed=0))
    assert chunked[:4] == translator.translate(lines[:4], sampling=True, seed=0)  # the first chunk: the seed's start
    assert chunked[4:8] != translator.translate(lines[4:8], sampling=True, seed=0)  # the next continues the stream


def test_hypotheses_come_best_first_with_their_scores(model_path):
    nbest = Translator.load(model_path, device="cpu").hypotheses(LINES, beam=4, nbest=3)
    assert [len(n) for n in nbest] == [3, 0, 3, 3, 3, 3, 3]
    for hypotheses in nbest:
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        assert all(h.text == " ".join(h.tokens) and h.log_prob <= 0 for h in hypotheses)


def test_prefixes_and_seeded_samples(model_path):
    translator = Translator.load(model_path, device="cpu")
    out = translator.translate(["a b c", "p o n"], prefixes=["n o", ""])
    assert out[0].split()[:2] == ["n", "o"] and out[1] == translator.translate(["p o n"])[0]
    samples = [translator.hypotheses(LINES, sampling=True, nbest=3, seed=5, max_len_b=6) for _ in range(2)]
    assert samples[0] == samples[1] and len(samples[0][0]) == 3
    assert [[h.text for h in n] for n in samples[0]] == [[r["text"] for r in n] for n in cli_nbest(
        model_path, "--sampling", "--nbest", 3, "--seed", 5, "--max-len-b", 6)]


def cli_nbest(model_path, *flags):
    import json

    return [json.loads(line)["nbest"] for line in cli(model_path, "--format", "jsonl", *flags)]


def test_options_are_checked_as_flags_are(model_path):
    translator = Translator.load(model_path, device="cpu")
    for options, message in [({"beam": 0}, "beam=0: must be >= 1"), ({"lenpen": float("nan")}, "finite"),
                             ({"seed": 3}, "seed applies only with --sampling"),
                             ({"sampling": True, "beam": 5}, "beam applies only to beam search")]:
        with pytest.raises(NmtError, match=message):
            translator.translate(["a b"], **options)
    with pytest.raises(TypeError, match="^unexpected option 'bean'; the search options are beam, lenpen, "):
        translator.translate(["a b"], bean=4)
    with pytest.raises(TypeError, match="unexpected option 'format'"):
        Translator.load(model_path, format="jsonl")
    with pytest.raises(NmtError, match="no such checkpoint"):
        Translator.load(model_path.parent / "missing.pt")


def test_search_options_are_keywords_typed_as_their_fields():
    """help(), IDEs and type checkers see every option with its type; the typed lists and the
    config fields they stand for stay one list."""
    import dataclasses
    import inspect
    import typing

    from nmt_cli.config import SearchConfig
    from nmt_cli.decode.translator import LoadOptions, SearchOptions
    from nmt_cli.run_config import RunConfig

    for options, config in ((SearchOptions, SearchConfig), (LoadOptions, RunConfig)):
        fields = {f.name: f for f in dataclasses.fields(config)}
        hints, field_hints = typing.get_type_hints(options), typing.get_type_hints(config)
        search = options is SearchOptions
        own = {k: v for k, v in hints.items() if search or k not in SearchOptions.__annotations__}
        assert set(own) == set(fields) - {"search"}
        for name, hint in own.items():
            literals = [a for a in (hint, *typing.get_args(hint)) if typing.get_origin(a) is typing.Literal]
            if literals:  # a Literal of the field's choices, where it has them
                assert set(typing.get_args(literals[0])) == set(fields[name].metadata["choices"]), name
            else:
                assert hint == field_hints[name], name
    shown = inspect.signature(Translator.hypotheses).parameters
    assert shown["beam"].kind is inspect.Parameter.KEYWORD_ONLY and shown["beam"].annotation is int
    assert shown["beam"].default == 4 and "search" not in shown and "attention" in shown
    assert inspect.signature(Translator.load).parameters["device"].default == "auto"
    assert issubclass(NmtError, ValueError)  # caught as any bad value is


def test_attention_gives_each_hypothesis_its_alignment(model_path):
    """As CTranslate2's return_attention: each hypothesis with its source-target alignment; the
    best one's is what `nmt translate --format jsonl --attention` writes."""
    import json

    translator = Translator.load(model_path, device="cpu", beam=3)
    found = translator.hypotheses(LINES, nbest=2, attention=True)
    records = [json.loads(line) for line in cli(model_path, "--beam", 3, "--format", "jsonl", "--attention")]
    for nbest, record in zip(found, records):
        if not nbest:
            assert "attention" not in record
            continue
        assert nbest[0].alignment == record["attention"]
        for hypothesis in nbest:
            weights = torch.tensor(hypothesis.alignment["weights"])
            assert weights.shape[0] == len(hypothesis.tokens) + 1  # each output token and </s>
            assert torch.allclose(weights.sum(1), torch.ones(weights.shape[0]), atol=1e-4)
    assert all(h.alignment is None for h in translator.hypotheses("a b", nbest=2))
    with pytest.raises(NmtError, match="^attention='yes': expected true or false$"):
        translator.hypotheses(["a b"], attention="yes")


def test_iteration_translates_any_number_of_lines_a_chunk_at_a_time(model_path, monkeypatch):
    translator = Translator.load(model_path, device="cpu", beam=2, max_len_a=0, max_len_b=3)
    searched, search = [], translator.engine.generator.search
    monkeypatch.setattr(translator.engine.generator, "search", lambda sources, *args: searched.append(len(sources)) or
                        search(sources, *args))
    lines = (line for _ in range(5) for line in LINES)  # a generator: never a list in memory
    assert list(translator.translate_iter(lines, chunk_lines=4)) == translator.translate(LINES * 5)
    iterated = searched[:-1]  # the last: translate() of them all at once
    assert max(iterated) <= 4 and sum(iterated) == 5 * len(LINES)  # each line once, never more than 4 held


def test_scores_of_given_targets_are_the_searchs_log_probabilities(model_path):
    translator = Translator.load(model_path, device="cpu", input_format="bpe", output_format="bpe", lenpen=0.6)
    sources = [line for line in LINES if line]
    best = [n[0] for n in translator.hypotheses(sources, beam=4)]
    scored = translator.score(sources, [h.text for h in best])
    for hypothesis, s in zip(best, scored):
        assert s.tokens == hypothesis.tokens + ["</s>"] and len(s.token_log_probs) == len(s.tokens)
        assert s.log_prob == pytest.approx(hypothesis.log_prob, abs=1e-4) == pytest.approx(sum(s.token_log_probs))
        assert s.score == pytest.approx(hypothesis.score, abs=1e-4)
    ensemble = Translator.load(model_path, model_path, device="cpu", input_format="bpe", output_format="bpe")
    assert [s.log_prob for s in ensemble.score(sources, [h.text for h in best])] == pytest.approx(
        [s.log_prob for s in scored], abs=1e-5)
    with pytest.raises(NmtError, match="2 sources but 1 targets"):
        translator.score(["a", "b"], ["c"])


def test_scores_come_in_batches_as_the_device_allows(model_path):
    translator = Translator.load(model_path, device="cpu", max_tokens=6)  # a few pairs per batch
    sources, targets = LINES * 3, list(reversed(LINES)) * 3
    alone = [Translator.load(model_path, device="cpu").score([s], [t])[0].token_log_probs
             for s, t in zip(sources, targets)]
    batched = [s.token_log_probs for s in translator.score(sources, targets)]
    assert all(torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5) for a, b in zip(alone, batched))
