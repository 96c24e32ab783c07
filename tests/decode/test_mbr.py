"""MBR decoding (mbr.py, --mbr N): its utilities are sacreBLEU's sentence chrF and BLEU to the
last bit, its choice is a written-out MBR over sacreBLEU's own sentence scores, and `nmt translate
--mbr`, the Python API and the options' checks draw the candidates a beam (or sampling) of N
gives."""

import itertools
import re

import pytest
import sacrebleu
from click.testing import CliRunner
from conftest import tiny_checkpoint

from nmt_cli import NmtError, Translator
from nmt_cli.cli import main
from nmt_cli.config import SearchConfig
from nmt_cli.decode import mbr

SENTENCES = ["Ein Mann fährt Fahrrad.", "Ein Mann fährt ein Fahrrad.", "Ein Mann fährt Rad .", "Zwei Hunde spielen.",
             "Ein Mann, ein Mann, ein Mann!", "", "ein mann fährt fahrrad", "Fahrrad", "Ein Mann fährt Fahrrad.",
             "Eine Frau (in Rot) liest \"Zeitung\" & lacht.", "a", "Ein Junge springt über einen Zaun im Park."]
LINES = ["a b c d", "", "p o n m l k", "e", "f g h i j k l m n o p a b c", "c c c"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("mbr") / "m.pt", seed=5)


@pytest.mark.parametrize("name, oracle", [("chrf", sacrebleu.sentence_chrf), ("bleu", sacrebleu.sentence_bleu)])
def test_the_utilities_are_sacrebleus_sentence_scores(name, oracle):
    """Every ordered pair, empty sides, repeats and punctuation included: equal, not close."""
    u = mbr.utility(name)
    for hypothesis, reference in itertools.product(SENTENCES, repeat=2):
        hyp, ref = u.features(hypothesis), u.features(reference)
        assert u.score(u.matches(hyp, ref), hyp, ref) == oracle(hypothesis, [reference]).score
        assert u.matches(hyp, ref) == u.matches(ref, hyp)


def written_out(texts: list[str], oracle) -> list[int]:
    """MBR as its definition reads: each candidate's mean sentence score against every other
    candidate (by position), highest first, ties to the earlier."""
    expected = [sum(oracle(c, [r]).score for j, r in enumerate(texts) if j != i) / (len(texts) - 1)
                for i, c in enumerate(texts)]
    return sorted(range(len(texts)), key=lambda i: (-expected[i], i))


@pytest.mark.parametrize("name, oracle", [("chrf", sacrebleu.sentence_chrf), ("bleu", sacrebleu.sentence_bleu)])
def test_the_ranking_is_a_written_out_mbr(name, oracle):
    u = mbr.utility(name)
    for start in range(0, len(SENTENCES) - 3):
        candidates = SENTENCES[start:start + 5]
        assert mbr.ranking(candidates, u) == written_out(candidates, oracle)
    # two equal candidates tie: the one the search ranked first goes first
    assert mbr.ranking(["Ein Hund.", "Ein Hund.", "Eine Katze."], u)[:2] == [0, 1]
    assert mbr.ranking(["Ein Hund."], u) == [0]


@pytest.mark.parametrize("candidates, search", [("beam", {"beam": 4, "nbest": 4}),
                                                ("sample", {"sampling": True, "nbest": 4, "seed": 7})])
def test_translate_with_mbr_chooses_among_the_searchs_candidates(model_path, candidates, search):
    """The API's and the command line's --mbr 4: a beam of 4's 4-best (or 4 samples of a seed),
    ranked by a written-out MBR over their text; --nbest 2 gives the first two of that order."""
    translator = Translator.load(model_path, device="cpu")
    drawn = translator.hypotheses(LINES, **search)
    options = {"mbr": 4, "mbr_candidates": candidates, **({"seed": 7} if candidates == "sample" else {})}
    chosen = translator.hypotheses(LINES, nbest=2, **options)
    reordered = 0
    for hyps, picked in zip(drawn, chosen):
        if not hyps:
            assert picked == []
            continue
        order = written_out([h.text for h in hyps], sacrebleu.sentence_chrf)
        assert picked == [hyps[i] for i in order[:2]]
        reordered += order[:2] != [0, 1]
    assert reordered  # MBR's order is not the search's
    best = [hyps[written_out([h.text for h in hyps], sacrebleu.sentence_bleu)[0]].text if hyps else ""
            for hyps in drawn]
    flags = ["--mbr", 4, "--mbr-utility", "bleu", "--mbr-candidates", candidates]
    flags += ["--seed", 7] if candidates == "sample" else []
    result = CliRunner().invoke(main, ["translate", "-m", str(model_path), "--device", "cpu", *map(str, flags)],
                                input="".join(line + "\n" for line in LINES))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == best
    assert repr(translator).endswith("beam 4, lenpen 0.6)")
    assert repr(Translator.load(model_path, device="cpu", mbr=8)).endswith("MBR (chrf) over 8 beam candidates)")


@pytest.mark.parametrize("options, message", [
    ({"mbr": 4, "beam": 5}, "beam applies only to beam search, not with --sampling or --mbr-candidates sample "
                            "(--nbest N: N samples) or --mbr (a beam of --mbr N)"),
    ({"mbr": 4, "sampling": True}, "mbr applies only without --sampling (--mbr-candidates sample draws the "
                                   "candidates)"),
    ({"mbr_utility": "bleu"}, "mbr_utility applies only with --mbr"),
    ({"mbr": 4, "mbr_candidates": "sample", "stopping": "heuristic"}, "stopping applies only to beam search"),
    ({"mbr": 4, "nbest": 5}, "--nbest 5 is larger than --mbr 4"),
    ({"mbr": 1}, "mbr=1: must be >= 2"),
    ({"mbr": 4, "mbr_utility": "ter"}, "mbr_utility='ter': expected one of chrf, bleu"),
])
def test_options_that_mbr_would_ignore_are_refused(model_path, options, message):
    translator = Translator.load(model_path, device="cpu")
    with pytest.raises(NmtError, match=f"^{re.escape(message)}"):
        translator.translate("a b", **options)
    assert SearchConfig(mbr=4, mbr_candidates="sample", temperature=0.5).candidates() == SearchConfig(
        sampling=True, nbest=4, temperature=0.5, mbr_candidates="sample")
    with pytest.raises(NmtError, match=r"^constraints apply to beam search, not with --sampling or --mbr-candidates "):
        translator.translate("a b", constraints=["c"], mbr=4, mbr_candidates="sample")
