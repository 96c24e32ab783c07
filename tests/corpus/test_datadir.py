"""The data directory: meta.json written with a checksum of every file, read and verified."""

import json

import pytest

from nmt_cli.corpus.datadir import META, DataDir, sha256
from nmt_cli.errors import NmtError
from nmt_cli.files import MARKER


def written(tmp_path):
    (tmp_path / "bpe.codes").write_text("a b\n")
    (tmp_path / MARKER).write_text("")  # the temporary directory's marker is not part of the data
    return DataDir.write(tmp_path, {"format_version": 1, "text": {"source_lang": "en", "target_lang": "de"},
                                    "bpe_codes": "bpe.codes", "joined_dictionary": True, "dtype": "uint16",
                                    "dictionaries": {"en": "dict.en.txt", "de": "dict.en.txt"}, "splits": {}})


def test_meta_lists_every_file_with_its_checksum(tmp_path):
    data = written(tmp_path)
    assert data.meta["checksums"] == {"bpe.codes": sha256(tmp_path / "bpe.codes")}
    assert json.loads((tmp_path / META).read_text()) == data.meta
    assert DataDir.files_of(tmp_path) == {META, MARKER, "bpe.codes"}  # a marker left by a kill may go too
    assert DataDir.open(tmp_path, verify=True).bpe_codes() == "a b\n"


def test_an_edited_or_missing_file_is_refused(tmp_path):
    written(tmp_path)
    (tmp_path / "bpe.codes").write_text("a c\n")
    DataDir.open(tmp_path)  # without verify: read as it is
    with pytest.raises(NmtError, match="bpe.codes: differs from the checksum in meta.json"):
        DataDir.open(tmp_path, verify=True)
    (tmp_path / "bpe.codes").unlink()
    with pytest.raises(NmtError, match="bpe.codes: missing from the data directory"):
        DataDir.open(tmp_path, verify=True)


def test_reuse_gives_the_codes_and_dictionaries_of_the_same_pair_only(tmp_path):
    data = written(tmp_path)
    text, fields = data.reuse("en", "de")
    assert (text.source_lang, fields["bpe_codes"], fields["tgtdict"]) == ("en", tmp_path / "bpe.codes",
                                                                          tmp_path / "dict.en.txt")
    with pytest.raises(NmtError, match="prepared for en-de, not en-fr"):
        data.reuse("en", "fr")


def test_a_directory_without_meta_has_no_files_of_ours(tmp_path):
    assert DataDir.files_of(tmp_path) is None
    (tmp_path / META).write_text("[1, 2]")
    assert DataDir.files_of(tmp_path) is None
