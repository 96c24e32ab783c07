"""`nmt score`: sacreBLEU's numbers and signature, the paper's BLEU, bad input."""

import importlib.util
import json

import pytest
import sacrebleu
from click.testing import CliRunner
from conftest import head, write_lines

from nmt_cli.cli import main
from nmt_cli.score import split_compounds

HYP = ["The cat sat on the well-known mat.", "A dog runs.", "Two men are talking"]
REF = ["The cat sat on the well-known mat.", "A dog is running.", "Two men talk."]


def score(tmp_path, *args, hyp=HYP, refs=(REF,)):
    write_lines(tmp_path / "hyp", hyp)
    ref_args = []
    for i, ref in enumerate(refs):
        write_lines(tmp_path / f"ref{i}", ref)
        ref_args += ["-r", str(tmp_path / f"ref{i}")]
    return CliRunner().invoke(main, ["score", *ref_args, "-i", str(tmp_path / "hyp"), *args])


def test_bleu_equals_sacrebleu_api(tmp_path):
    result = score(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    expected = sacrebleu.corpus_bleu(HYP, [REF])
    assert record["score"] == round(expected.score, 4)
    assert "tok:13a" in record["signature"] and "version:" in record["signature"]


def test_on_real_sentences_with_two_references(multi30k, tmp_path):
    refs = (head(multi30k / "val.de", 50), head(multi30k / "train.de", 50))
    hyp = head(multi30k / "val.de", 50)[::-1]
    result = score(tmp_path, "-m", "bleu", "-m", "chrf", "-m", "ter", "--json", hyp=hyp, refs=refs)
    records = [json.loads(line) for line in result.output.splitlines()]
    assert records[0]["score"] == round(sacrebleu.corpus_bleu(hyp, list(refs)).score, 4)
    assert records[1]["score"] == round(sacrebleu.corpus_chrf(hyp, list(refs)).score, 4)
    assert records[2]["score"] == round(sacrebleu.corpus_ter(hyp, list(refs)).score, 4)


def test_text_output_has_signature_and_lowercase(tmp_path):
    result = score(tmp_path, "--lowercase", "--tokenize", "intl")
    assert "case:lc" in result.output and "tok:intl" in result.output


def test_line_count_mismatch_names_both_counts(tmp_path):
    result = score(tmp_path, hyp=HYP[:2])
    assert result.exit_code == 1
    assert "has 2 lines but" in result.output and "has 3" in result.output


def test_hypothesis_from_stdin(tmp_path):
    write_lines(tmp_path / "ref", REF)
    result = CliRunner().invoke(main, ["score", "-r", str(tmp_path / "ref"), "--json"], input="\n".join(HYP) + "\n")
    assert json.loads(result.output)["score"] == round(sacrebleu.corpus_bleu(HYP, [REF]).score, 4)


@pytest.mark.parametrize("args, message", [
    (["--sentence", "--paper-bleu", "de"], "--sentence and --paper-bleu do not go together"),
    (["--paper-bleu", "zz"], "--paper-bleu zz: not a language of the Moses tokenizer (as, bn, ca,"),
    (["--tokenize", "bogus"], "Invalid value for '--tokenize': 'bogus' is not one of '13a', 'intl'"),
    (["--tokenize", "flores200"], "Invalid value for '--tokenize': 'flores200' is not one of"),  # a download
    pytest.param(["--tokenize", "ja-mecab"], "--tokenize ja-mecab: Japanese tokenization requires extra dependencies",
                 marks=pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="MeCab is installed")),
])
def test_what_nmt_score_cannot_do_is_one_line(tmp_path, args, message):
    result = score(tmp_path, *args)
    assert result.exit_code in (1, 2) and message in result.output and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: ")


def test_paper_bleu_is_labelled_and_splits_compounds(tmp_path):
    assert split_compounds("a well-known long-term plan") == "a well ##AT##-##AT## known long ##AT##-##AT## term plan"
    assert split_compounds("x-y-z") == "x ##AT##-##AT## y ##AT##-##AT## z"
    result = score(tmp_path, "--paper-bleu", "en", "--json")
    paper = json.loads(result.output.splitlines()[1])
    assert paper["metric"] == "paper_bleu" and "not comparable to sacreBLEU" in paper["signature"]
    tokenized = [split_compounds(s) for s in
                 ["The cat sat on the well-known mat .", "A dog runs .", "Two men are talking"]]
    refs = [split_compounds(s) for s in ["The cat sat on the well-known mat .", "A dog is running .", "Two men talk ."]]
    assert paper["score"] == round(sacrebleu.corpus_bleu(tokenized, [refs], tokenize="none", force=True).score, 4)


def test_bpe_markers_in_the_hypotheses_are_warned_once_and_still_scored(tmp_path):
    marked = ["The cat sat on the well-@@ known mat.", "A dog runs.", "Two men are talk@@"]
    result = score(tmp_path, "--json", hyp=marked)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {tmp_path / 'hyp'} line 1 holds BPE markers ('@@ '): this scores subwords, not "
                        "words; score nmt translate's output, or remove them first: sed -r 's/(@@ )|(@@ ?$)//g'"]
    assert json.loads(result.stdout)["score"] == round(sacrebleu.corpus_bleu(marked, [REF]).score, 4)
    assert "warning" not in score(tmp_path, "--json").stderr  # no markers, no warning


def sacrebleu_cli(*args):
    """sacreBLEU's own command line, 4 decimals (the independent rendering of its numbers)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sacrebleu", *map(str, args), "-f", "text", "-w", "4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_lines_scores_are_sacrebleus_sentence_level(multi30k, tmp_path):
    refs, hyps = head(multi30k / "val.de", 40), head(multi30k / "val.de", 20) + head(multi30k / "val.en", 40)[20:]
    write_lines(tmp_path / "ref", refs)
    write_lines(tmp_path / "hyp", hyps)
    result = CliRunner().invoke(main, ["score", "-r", tmp_path / "ref", "-i", tmp_path / "hyp", "-m", "bleu", "-m",
                                       "chrf", "--sentence"])
    assert result.exit_code == 0, result.output
    ours = [line.split("\t") for line in result.stdout.splitlines()]
    for column, name in enumerate(("bleu", "chrf")):
        theirs = [line.split(" = ")[1].split()[0] for line in sacrebleu_cli(
            tmp_path / "ref", "-i", tmp_path / "hyp", "-m", name, "--sentence-level").splitlines()]
        assert [row[column] for row in ours] == theirs and len(theirs) == 40
    records = CliRunner().invoke(main, ["score", "-r", tmp_path / "ref", "-i", tmp_path / "hyp", "--sentence",
                                        "--json"]).stdout.splitlines()
    assert json.loads(records[0]) == {"line": 1, "bleu": 100.0} and len(records) == 40


def test_two_systems_compared_as_sacrebleus_paired_bootstrap(multi30k, tmp_path):
    """Each system's score, mean and 95% confidence interval, and the second's p-value."""
    import re

    refs = head(multi30k / "val.de", 60)
    write_lines(tmp_path / "ref", refs)
    write_lines(tmp_path / "a", head(multi30k / "val.en", 60))
    write_lines(tmp_path / "b", refs[:30] + head(multi30k / "val.en", 60)[30:])
    result = CliRunner().invoke(main, ["score", "-r", tmp_path / "ref", "--compare", tmp_path / "a", tmp_path / "b",
                                       "-m", "bleu", "-m", "chrf", "--json"])
    assert result.exit_code == 0, result.output
    ours = [json.loads(line) for line in result.stdout.splitlines()]
    table = sacrebleu_cli(tmp_path / "ref", "-i", tmp_path / "a", tmp_path / "b", "-m", "bleu", "chrf", "--paired-bs")
    cells = [tuple(map(float, cell)) for cell in re.findall(r"(\d+\.\d+) \((\d+\.\d+) ± (\d+\.\d+)\)", table)]
    assert [(s["score"], s["mean"], s["ci"]) for system in (0, 1) for s in (o["systems"][system] for o in ours)] == \
        cells  # the table's rows: system a's BLEU, chrF2, then b's
    assert [o["systems"][1]["p_value"] for o in ours] == [float(p) for p in re.findall(r"p = (\d+\.\d+)", table)]
    assert [o["metric"] for o in ours] == ["BLEU", "chrF2"] and "bs:1000|seed:12345" in ours[0]["signature"]
    refused = CliRunner().invoke(main, ["score", "-r", tmp_path / "ref", "--compare", tmp_path / "a", tmp_path / "b",
                                        "-i", tmp_path / "a"])
    assert refused.exit_code == 2 and "-i and --compare do not go together" in refused.output
