"""The table of formats: `nmt export --format`'s choices are its writers, each option applies to
the writers that list it, each writer's listed files cover what it writes, a reader is chosen by
what the source holds, and choosing one imports no torch."""

import dataclasses
import subprocess
import sys

import pytest
from conftest import NEEDS_CTRANSLATE2, tiny_checkpoint

from nmt_cli.errors import NmtError
from nmt_cli.interop.card import CardConfig
from nmt_cli.interop.exporter import export_model
from nmt_cli.interop.formats import READERS, WRITERS, reader_for
from nmt_cli.run_config import EXPORT_FORMATS, ExportConfig


def test_the_export_choices_are_the_writers():
    assert tuple(WRITERS) == EXPORT_FORMATS


@pytest.mark.parametrize("option", [f.name for f in dataclasses.fields(ExportConfig) if f.name != "format"])
def test_an_export_option_applies_to_the_writers_that_list_it(option):
    applies, _ = ExportConfig.__dataclass_fields__[option].metadata["only_if"]
    for writer in WRITERS.values():
        assert applies(ExportConfig(format=writer.name)) == (option in writer.options), (option, writer.name)


@NEEDS_CTRANSLATE2
@pytest.mark.parametrize("name", ["ctranslate2", "safetensors"])
def test_a_writer_writes_only_the_files_it_lists(tmp_path, name):
    model = tiny_checkpoint(tmp_path / "m.pt")
    out = tmp_path / ("out.safetensors" if name == "safetensors" else "out")
    export_model(model, out, ExportConfig(format=name), CardConfig())
    if WRITERS[name].files:
        assert {p.name for p in out.iterdir()} <= WRITERS[name].files
    else:
        assert out.is_file()


def test_a_reader_is_chosen_by_what_the_source_holds(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "npz").mkdir()
    (tmp_path / "npz" / "model.npz").write_bytes(b"")
    (tmp_path / "file.pt").write_bytes(b"")
    assert [reader_for(tmp_path / p).name for p in ("hf", "npz", "file.pt")] == ["transformers", "marian", "checkpoint"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(NmtError) as refused:
        reader_for(tmp_path / "empty")
    assert "neither " + " nor ".join(r.summary for r in READERS if r.name != "checkpoint") in str(refused.value)


def test_the_table_imports_no_torch():
    code = ("import sys; from pathlib import Path; from nmt_cli.interop import formats; "
            "formats.reader_for(Path(sys.executable)); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
