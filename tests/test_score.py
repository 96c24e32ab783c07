"""`nmt score`: sacreBLEU's numbers and signature, the paper's BLEU, bad input."""

import json

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
