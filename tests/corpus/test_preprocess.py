"""`nmt preprocess`: filtering, alignment, reuse, parallel == serial, and every bad input."""

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import head, write_lines

from nmt_cli.cli import main
from nmt_cli.config import PreprocessConfig, TextConfig
from nmt_cli.corpus.data import IndexedArray
from nmt_cli.text.bpe import learn_bpe
from nmt_cli.text.processor import TextProcessor, subword_counts
from nmt_cli.text.vocab import Vocabulary

TRAIN_EN = ["the red cat", "a dog", "", " ".join(["word"] * 25), "cats sit on mats",
            "hello", "the the the the the the the the"]
TRAIN_DE = ["die rote Katze", "ein Hund", "Zug", "eins zwei", "Katzen sitzen auf Matten", "", "die"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def corpus(tmp_path, en=TRAIN_EN, de=TRAIN_DE):
    write_lines(tmp_path / "train.en", en)
    write_lines(tmp_path / "train.de", de)
    write_lines(tmp_path / "valid.en", ["the cat", "", "unseen words here", "dog"])
    write_lines(tmp_path / "valid.de", ["die Katze", "rote Katzen", "", "Hund"])
    return tmp_path


def preprocess(tmp_path, *extra, dest="out"):
    return run("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "train",
               "--validpref", tmp_path / "valid", "--destdir", tmp_path / dest, "--quiet", "--workers", 1,
               "--bpe-merges", 10, *extra)


def read_split(dest, split, lang):
    meta = json.loads((dest / "meta.json").read_text())
    array = IndexedArray(dest / f"{split}.{lang}", np.dtype(meta["dtype"]))
    vocab = Vocabulary.load(dest / f"dict.{lang}.txt")
    return [vocab.decode(array[i].tolist()) for i in range(len(array))]


def test_filtering_counts_and_kept_pairs(tmp_path):
    result = preprocess(corpus(tmp_path), "--max-len", 20, "--max-len-ratio", 2.0)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    train = meta["splits"]["train"]
    assert train["pairs_in"] == 7 and train["pairs_out"] == 3
    assert train["dropped"] == {"empty": 2, "too_long": 1, "length_ratio": 1}
    for flag, why in (("--max-len-ratio 2", "sides whose token counts differ by more than that"),
                      ("--max-len 20", "a side longer than that many tokens")):  # each a seventh: warned of
        assert f"warning: 1 of 7 training pairs (14%) dropped by {flag} ({why}, in Moses words): raise it" \
            in result.stderr
    kept = [" ".join(t).replace("@@ ", "") for t in read_split(tmp_path / "out", "train", "en")]
    assert kept == ["the red cat", "a dog", "cats sit on mats"]


def test_bpe_length_filter_after_segmentation(tmp_path):
    # 3 words fit max-len 3, but with no merges learned each word of 5 characters is 5 subwords.
    write_lines(tmp_path / "train.en", ["abcde fghij klmno", "a b"])
    write_lines(tmp_path / "train.de", ["abcde fghij klmno", "a b"])
    write_lines(tmp_path / "valid.en", ["a"])
    write_lines(tmp_path / "valid.de", ["a"])
    result = preprocess(tmp_path, "--max-len", 3, "--bpe-merges", 1)
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    assert result.exit_code == 0, result.output
    assert meta["splits"]["train"]["dropped"] == {"too_long": 1} and meta["splits"]["train"]["pairs_out"] == 1


def test_valid_split_keeps_alignment_and_empty_lines(tmp_path):
    assert preprocess(corpus(tmp_path)).exit_code == 0
    en, de = read_split(tmp_path / "out", "valid", "en"), read_split(tmp_path / "out", "valid", "de")
    assert len(en) == len(de) == 4
    assert en[1] == [] and de[2] == []
    assert "<unk>" in en[2]
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    assert meta["splits"]["valid"]["pairs_out"] == 4 and meta["splits"]["valid"]["unk_rate"]["en"] > 0


def test_meta_records_settings_versions_and_checksums(tmp_path):
    assert preprocess(corpus(tmp_path), "--lowercase").exit_code == 0
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    assert meta["text"]["lowercase"] is True and meta["joined_dictionary"] is True
    assert set(meta["versions"]) == {"sacremoses", "subword-nmt", "numpy"}
    assert "train.en.bin" in meta["checksums"] and "bpe.codes" in meta["checksums"]
    assert (tmp_path / "out/bpe.codes").read_text().startswith("#version")


def test_separate_dictionaries(tmp_path):
    assert preprocess(corpus(tmp_path), "--separate-dictionaries").exit_code == 0
    en = Vocabulary.load(tmp_path / "out/dict.en.txt")
    de = Vocabulary.load(tmp_path / "out/dict.de.txt")
    assert en != de
    assert json.loads((tmp_path / "out/meta.json").read_text())["joined_dictionary"] is False


def test_gzip_input(tmp_path):
    corpus(tmp_path)
    for lang in ("en", "de"):
        data = (tmp_path / f"train.{lang}").read_bytes()
        (tmp_path / f"train.{lang}").unlink()
        with gzip.open(tmp_path / f"train.{lang}.gz", "wb") as f:
            f.write(data)
    result = preprocess(tmp_path)
    assert result.exit_code == 0, result.output


def test_reuse_data_dir_for_new_test_set(tmp_path):
    assert preprocess(corpus(tmp_path)).exit_code == 0
    write_lines(tmp_path / "new.en", TRAIN_EN[:2])
    write_lines(tmp_path / "new.de", TRAIN_DE[:2])
    result = run("preprocess", "-s", "en", "-t", "de", "--testpref", tmp_path / "new", "--destdir",
                 tmp_path / "new_out", "--from-data", tmp_path / "out", "--quiet")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "new_out/dict.en.txt").read_text() == (tmp_path / "out/dict.en.txt").read_text()
    assert read_split(tmp_path / "new_out", "test", "en") == read_split(tmp_path / "out", "train", "en")[:2]


@pytest.mark.slow
def test_two_workers_write_the_same_files_as_one(multi30k, tmp_path):
    for name in ("train", "valid"):
        for lang in ("en", "de"):
            write_lines(tmp_path / f"{name}.{lang}", head(multi30k / f"train.{lang}", 2500 if name == "train" else 300))
    assert preprocess(tmp_path, "--bpe-merges", 300, dest="one").exit_code == 0
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "train", "--validpref",
                 tmp_path / "valid", "--destdir", tmp_path / "two", "--quiet", "--workers", 2, "--bpe-merges", 300)
    assert result.exit_code == 0, result.output
    one = json.loads((tmp_path / "one/meta.json").read_text())["checksums"]
    two = json.loads((tmp_path / "two/meta.json").read_text())["checksums"]
    assert one == two


def test_workers_filter_chunks_and_the_kept_pairs_stay_in_order(tmp_path, monkeypatch):
    # Chunks of 3 pairs: the first keeps two, the second is dropped whole, the third keeps its one.
    monkeypatch.setattr("nmt_cli.corpus.preprocess.TRAIN_CHUNK_LINES", 3)
    en = ["the red cat", "a dog", "", "", "hello", "x \x00 y", "cats sit on mats"]
    de = ["die rote Katze", "ein Hund", "Zug", "", "", "x y", "Katzen sitzen auf Matten"]
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", corpus(tmp_path, en, de) / "train",
                 "--destdir", tmp_path / "out", "--quiet", "--workers", 2, "--bpe-merges", 10)
    assert result.exit_code == 0, result.output
    train = json.loads((tmp_path / "out/meta.json").read_text())["splits"]["train"]
    assert train["pairs_in"] == 7 and train["pairs_out"] == 3
    assert train["dropped"] == {"empty": 3, "nul_byte": 1}
    for lang, expected in (("en", ["the red cat", "a dog", "cats sit on mats"]),
                           ("de", ["die rote Katze", "ein Hund", "Katzen sitzen auf Matten"])):
        assert [" ".join(t).replace("@@ ", "") for t in read_split(tmp_path / "out", "train", lang)] == expected


def test_round_trip_through_the_data_dir(multi30k, tmp_path):
    for lang in ("en", "de"):
        write_lines(tmp_path / f"train.{lang}", head(multi30k / f"train.{lang}", 1000))
        write_lines(tmp_path / f"valid.{lang}", head(multi30k / f"val.{lang}", 200))
    assert preprocess(tmp_path, "--bpe-merges", 500).exit_code == 0
    processor = TextProcessor(TextConfig("en", "de"), "en")
    back = [processor.decode(tokens) for tokens in read_split(tmp_path / "out", "valid", "en")]
    originals = [processor.normalizer.normalize(line) for line in head(multi30k / "val.en", 200)]
    unk_free = [(b, o) for b, o in zip(back, originals) if "<unk>" not in b]
    assert len(unk_free) > 150
    assert sum(b == o for b, o in unk_free) >= 0.98 * len(unk_free)


# ---------------------------------------------------------------------------- bad input

def test_line_count_mismatch(tmp_path):
    corpus(tmp_path, de=TRAIN_DE[:-2])
    result = preprocess(tmp_path)
    assert result.exit_code == 1
    assert f"{tmp_path / 'train.de'}:6: file ends here" in result.output and "line counts differ" in result.output
    assert not (tmp_path / "out").exists()


def test_target_longer_than_source(tmp_path):
    corpus(tmp_path, en=TRAIN_EN[:3])
    result = preprocess(tmp_path)
    assert result.exit_code == 1 and f"{tmp_path / 'train.en'}:4: file ends here" in result.output


def test_invalid_utf8_names_the_line(tmp_path):
    corpus(tmp_path)
    with open(tmp_path / "train.de", "ab") as f:
        f.write(b"ok\nbad \xff byte\n")
    with open(tmp_path / "train.en", "ab") as f:
        f.write(b"ok\nfine\n")
    result = preprocess(tmp_path)
    assert result.exit_code == 1 and f"{tmp_path / 'train.de'}:9: invalid UTF-8" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not list(tmp_path.glob(".out*")) and not (tmp_path / "out").exists()


def test_missing_file(tmp_path):
    corpus(tmp_path)
    (tmp_path / "valid.de").unlink()
    result = preprocess(tmp_path)
    assert result.exit_code == 1 and f"{tmp_path / 'valid.de'}: no such file" in result.output


def test_non_empty_destdir_needs_force(tmp_path):
    corpus(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out/keep.txt").write_text("mine")
    result = preprocess(tmp_path)
    assert result.exit_code == 1 and "exists and is not empty" in result.output
    # --force replaces only what nmt wrote: a directory holding a file of the user's is refused.
    result = preprocess(tmp_path, "--force")
    assert result.exit_code == 1 and "--force replaces only a directory made by `nmt preprocess`" in result.output
    assert (tmp_path / "out/keep.txt").read_text() == "mine"
    (tmp_path / "out/keep.txt").unlink()
    assert preprocess(tmp_path).exit_code == 0  # empty: no --force needed
    (tmp_path / "out/notes.txt").write_text("mine")  # a user's file inside an earlier output
    result = preprocess(tmp_path, "--force")
    assert result.exit_code == 1 and "--force would delete notes.txt, which nmt did not write" in result.output
    (tmp_path / "out/notes.txt").unlink()
    before = (tmp_path / "out/meta.json").read_text()
    assert preprocess(tmp_path, "--force", "--bpe-merges", 5).exit_code == 0  # an earlier output is replaced
    assert (tmp_path / "out/meta.json").read_text() != before


def test_force_never_deletes_the_inputs(tmp_path, monkeypatch):
    (tmp_path / "c").mkdir()
    corpus(tmp_path / "c")
    for dest in ("c", "."):  # the corpus' own directory; the current directory (which holds it)
        monkeypatch.chdir(tmp_path)
        result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", "c/train", "--destdir", dest, "--force",
                     "--quiet", "--workers", 1, "--bpe-merges", 10)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert "holds the input" in result.output or "holds it" in result.output
    assert (tmp_path / "c/train.en").exists() and (tmp_path / "c/train.de").exists()


def test_only_our_own_leftovers_are_swept(tmp_path):
    """A killed run's temporaries go; a user's files that merely look like temporaries stay."""
    from nmt_cli.files import HOST, MARKER, remove_stale_temporaries

    corpus(tmp_path)
    dead = 2**22 + 12345  # above the kernel's default pid_max: no process has it
    user_file, user_dir = tmp_path / ".notes.tmp-999999", tmp_path / f".thesis.nmt-tmp-{HOST}-{dead}-0123456789abcdef"
    user_file.write_text("mine")
    user_dir.mkdir()
    (user_dir / "ch1.tex").write_text("x")  # our name, but no marker inside: not ours
    other_host = tmp_path / f".out.nmt-tmp-otherhost-{dead}-0123456789abcdef"
    other_host.write_text("a live run on another machine of a shared file system")
    ours_file = tmp_path / f".out.nmt-tmp-{HOST}-{dead}-fedcba9876543210"
    ours_file.write_text("half a file")
    ours_dir = tmp_path / f".out.nmt-tmp-{HOST}-{dead}-00112233445566aa"
    ours_dir.mkdir()
    (ours_dir / MARKER).touch()
    remove_stale_temporaries(tmp_path)
    assert user_file.exists() and (user_dir / "ch1.tex").exists() and other_host.exists()
    assert not ours_file.exists() and not ours_dir.exists()
    assert preprocess(tmp_path).exit_code == 0 and user_file.exists() and (user_dir / "ch1.tex").exists()


def test_a_second_run_on_the_same_destdir_is_refused(tmp_path):
    from nmt_cli.files import DirectoryLock

    corpus(tmp_path)
    with DirectoryLock(tmp_path / ".out.nmt-lock", "test"):
        result = preprocess(tmp_path)
    assert result.exit_code == 1 and f"is in use by process {os.getpid()} on" in result.output
    assert not (tmp_path / "out").exists()
    assert preprocess(tmp_path).exit_code == 0 and not (tmp_path / ".out.nmt-lock").exists()


def test_empty_training_set_after_filtering(tmp_path):
    corpus(tmp_path, en=["one", "", "two"], de=["", "zwei", "drei vier fuenf sechs sieben"])
    result = preprocess(tmp_path)
    assert result.exit_code == 1 and "no training pair is left after filtering" in result.output
    assert not (tmp_path / "out").exists()


def test_interrupted_run_leaves_no_directory(tmp_path, monkeypatch):
    import nmt_cli.corpus.preprocess as pp

    corpus(tmp_path)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pp, "build_vocabularies", crash)
    with pytest.raises(KeyboardInterrupt):
        pp.preprocess(PreprocessConfig(TextConfig("en", "de"), tmp_path / "out", str(tmp_path / "train"),
                                           bpe_merges=5, workers=1, progress=False))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_same_language_twice_is_refused(tmp_path):
    corpus(tmp_path)
    result = run("preprocess", "-s", "en", "-t", "en", "--trainpref", tmp_path / "train", "--destdir", tmp_path / "o")
    assert result.exit_code == 1 and "both 'en'" in result.output


def test_bad_bpe_codes_name_the_line(tmp_path):
    corpus(tmp_path)
    (tmp_path / "codes").write_text("#version: 0.2\nt h\nbad line here\n")
    result = preprocess(tmp_path, "--bpe-codes", tmp_path / "codes")
    assert result.exit_code == 1 and "BPE codes:3: expected a merge" in result.output


def test_corpus_with_nothing_to_merge(tmp_path):
    corpus(tmp_path, en=["a b", "c"], de=["d", "e f"])
    result = preprocess(tmp_path, "--max-len-ratio", 3)
    assert result.exit_code == 1 and "--bpe-merges 0" in result.output
    assert preprocess(tmp_path, "--max-len-ratio", 3, "--bpe-merges", 0, dest="nobpe").exit_code == 0
    assert not (tmp_path / "nobpe/bpe.codes").exists()


def test_reuse_for_another_language_pair_is_refused(tmp_path):
    assert preprocess(corpus(tmp_path)).exit_code == 0
    result = run("preprocess", "-s", "de", "-t", "en", "--testpref", tmp_path / "train", "--destdir", tmp_path / "x",
                 "--from-data", tmp_path / "out")
    assert result.exit_code == 1 and "prepared for en-de, not de-en" in result.output


def test_workers_segment_every_training_word_for_the_vocabulary(multi30k, monkeypatch):
    import nmt_cli.corpus.preprocess as pp

    config = TextConfig("en", "de")
    plain = TextProcessor(config, "en")
    counts = tuple(Counter(w for line in head(multi30k / f"train.{lang}", 300) for w in plain.tokenize(line))
                   for lang in ("en", "de"))
    codes = learn_bpe(counts[0] + counts[1], 200)
    segmenter, reference = TextProcessor(config, "en", codes), TextProcessor(config, "en", codes)
    opts = PreprocessConfig(config, Path("unused"), workers=2, progress=False)
    monkeypatch.setattr(pp, "CHUNK_WORDS", 100)  # several chunks per worker, whose counts are summed
    subwords = pp.count_subwords(opts, segmenter, counts)
    words = [w for w in counts[0] | counts[1] if len(w) > 1]
    assert all(w in segmenter.bpe.cache for w in words)  # filled by the workers: this process segmented nothing
    assert segmenter.segment(words) == reference.segment(words)
    assert subwords == tuple(subword_counts(reference, side) for side in counts)
    assert subwords[0] != subwords[1]


def test_preprocessing_does_not_load_torch(tmp_path):
    # Loading torch would add 1-3 s and some 50 MB to every `nmt preprocess`, which never uses it.
    args = ["preprocess", "-s", "en", "-t", "de", "--trainpref", str(corpus(tmp_path) / "train"), "--destdir",
            str(tmp_path / "out"), "--quiet", "--workers", "2", "--bpe-merges", "10"]
    code = (f"import sys; from nmt_cli.cli import main; main({args!r}, standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("pattern", ["x*", r"\b", "(?=a)", "(?<=a)", "(a|)", "x?"])
def test_a_protected_pattern_that_can_match_an_empty_string_is_refused(tmp_path, pattern):
    """Zero-width patterns too: they would match between every two characters (a MemoryError
    after gigabytes, in round 3 of the attacks)."""
    result = preprocess(corpus(tmp_path), "--protect", pattern)
    assert result.exit_code == 2 and f"--protect {pattern!r}: can match an empty string" in result.output
    assert not (tmp_path / "out").exists()
    assert preprocess(corpus(tmp_path), "--protect", r"[A-Z]{2,}").exit_code == 0


@pytest.mark.parametrize("flags", [["--lowercase"], ["--bpe-merges", "5"], ["--vocab-size", "10"],
                                   ["--separate-dictionaries"]])
def test_reusing_a_data_directory_refuses_the_settings_it_decides(tmp_path, flags):
    assert preprocess(corpus(tmp_path)).exit_code == 0
    result = run("preprocess", "-s", "en", "-t", "de", "--testpref", tmp_path / "valid", "--destdir",
                 tmp_path / "more", "--from-data", tmp_path / "out", "--quiet", *flags)
    assert result.exit_code == 2 and "applies only without --from-data" in result.output and flags[0] in result.output


def test_the_summary_fits_80_columns(multi30k, tmp_path):
    for split, n in (("train", 3000), ("val", 300)):
        for lang in ("en", "de"):
            write_lines(tmp_path / f"{split}.{lang}", head(multi30k / f"{split}.{lang}", n))
    done = subprocess.run([sys.executable, "-m", "nmt_cli", "preprocess", "-s", "en", "-t", "de", "--trainpref",
                           str(tmp_path / "train"), "--validpref", str(tmp_path / "val"), "--testpref",
                           str(tmp_path / "val"), "--destdir", str(tmp_path / "out"), "--bpe-merges", "500",
                           "--workers", "1"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in done.stderr, done.stderr
    train = next(line.split() for line in lines if line.strip().startswith("train "))
    meta = json.loads((tmp_path / "out/meta.json").read_text())["splits"]["train"]
    assert train[1:4] == [f"{meta['pairs_out']:,}", f"{meta['tokens']['en']:,}", f"{meta['tokens']['de']:,}"]
    dropped = ", ".join(f"{k} {v:,}" for k, v in meta["dropped"].items())
    assert f"train: {meta['pairs_in'] - meta['pairs_out']:,} of 3,000 pairs dropped ({dropped})" in done.stderr


def test_a_byte_order_mark_opening_a_file_is_no_word(tmp_path):
    raw = corpus(tmp_path)
    for lang in ("en", "de"):
        path = raw / f"train.{lang}"
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert preprocess(raw).exit_code == 0
    for lang in ("en", "de"):
        assert "\ufeff" not in (tmp_path / f"out/dict.{lang}.txt").read_text(encoding="utf-8")

