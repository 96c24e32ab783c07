"""What `nmt preprocess` shows on a terminal."""

import gzip

from conftest import cli, synthetic_pairs, write_lines

from nmt_cli.corpus import report


def test_the_progress_bars_count_pairs_out_of_their_totals(tmp_path, monkeypatch):
    """On a terminal each stage shows how many pairs of how many (gzipped input counted as text)."""
    pairs = synthetic_pairs(50, seed=0) + [("a b c d e f g h", "a")]  # the last is dropped (--max-len-ratio)
    write_lines(tmp_path / "train.src", [s for s, _ in pairs])
    write_lines(tmp_path / "train.tgt", [t for _, t in pairs])
    with gzip.open(tmp_path / "valid.src.gz", "wt") as packed:
        packed.write("a b\nc d\ne\nf g\n")
    write_lines(tmp_path / "valid.tgt", ["b a", "d c", "e", "g f"])
    monkeypatch.setattr(report, "show_progress", lambda opts: True)
    result = cli("preprocess", "-s", "src", "-t", "tgt", "--trainpref", tmp_path / "train", "--validpref",
                 tmp_path / "valid", "--destdir", tmp_path / "out", "--tokenizer", "none", "--bpe-merges", 0,
                 "--max-len-ratio", 3, "--workers", 1)
    assert result.exit_code == 0, result.output
    bars = {line.split(":")[0]: line for line in result.stderr.replace("\r", "\n").splitlines() if "100%" in line}
    assert "51/51" in bars["tokenize train"] and "50/50" in bars["binarize train"] and "4/4" in bars["binarize valid"]
