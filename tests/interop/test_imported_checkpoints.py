"""Everything nmt-cli does, on checkpoints imported from fairseq and OpenNMT-py (importer.py's
read_checkpoint_file; the imports' exactness: test_import_fairseq.py, test_import_onmt.py): data
prepared for the model, fine-tuning, averaging, a shortlist, the CTranslate2 export and the
server (a student distilled from one: test_distill.py)."""

import functools
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import NEEDS_CTRANSLATE2, cli, multi30k_lines, request, serving, write_lines

from nmt_cli.decode.translator import Translator

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# A fixture of each format, with the subword model of its text.
FORMATS = {"fairseq": (FIXTURES / "fairseq/bpe/checkpoint.pt", ["--bpe-codes", FIXTURES / "fairseq/bpe/bpe.codes"]),
           "OpenNMT-py": (FIXTURES / "onmt/spm/model_step_400.pt",
                          ["--sentencepiece", FIXTURES / "onmt/spm/spm.model"])}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Callable[[str], tuple[Path, Path, Path]]:
    """Of a format's fixture, made once: the imported checkpoint, Multi30k slices
    (raw/{train,val,test_2016_flickr}.{en,de}) and the data `nmt preprocess --from-model` makes of them."""
    return functools.cache(lambda name: prepare(name, tmp_path_factory.mktemp(name)))


def prepare(name: str, tmp: Path) -> tuple[Path, Path, Path]:
    checkpoint, text = FORMATS[name]
    result = cli("import", checkpoint, "-o", tmp / "imported.pt", "-s", "en", "-t", "de", *text)
    assert result.exit_code == 0, result.output
    raw = tmp / "raw"
    raw.mkdir()
    for split, n in (("train", 200), ("val", 20), ("test_2016_flickr", 10)):
        for lang in ("en", "de"):
            write_lines(raw / f"{split}.{lang}", multi30k_lines(n, lang, "val" if split != "train" else split))
    result = cli("preprocess", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "val",
                 "--destdir", tmp / "data", "--from-model", tmp / "imported.pt", "--quiet", "--workers", 1)
    assert result.exit_code == 0, result.output
    return tmp / "imported.pt", raw, tmp / "data"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_fine_tuned_averaged_shortlisted_and_served(prepared, tmp_path, name):
    model, raw, data = prepared(name)
    result = cli("train", data, "--init-from", model, "--max-tokens", 400, "--max-updates", 4,
                 "--save-interval-updates", 2, "--save-dir", tmp_path / "ck", "--device", "cpu", "--threads", 1,
                 "--quiet")
    assert result.exit_code == 0, result.output
    averaged = cli("average-checkpoints", "--dir", tmp_path / "ck", "--last", 2, "-o", tmp_path / "avg.pt")
    assert averaged.exit_code == 0, averaged.output
    assert cli("shortlist", data, "-o", tmp_path / "list", "--first", 50, "--best", 5).exit_code == 0
    lines = multi30k_lines(20, "en", "val")
    shortlisted = cli("translate", "-m", tmp_path / "avg.pt", "--shortlist", tmp_path / "list", "--beam", 1,
                      "--device", "cpu", input="".join(line + "\n" for line in lines))
    assert shortlisted.exit_code == 0 and len(shortlisted.stdout.splitlines()) == 20, shortlisted.output
    translator = Translator.load(model, device="cpu")
    _, url, process = serving(tmp_path, model=model)
    try:
        status, answer = request(url + "/translate", {"text": lines[:3]})
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert status == 200 and answer["translations"] == translator.translate(lines[:3])


@pytest.mark.slow
@NEEDS_CTRANSLATE2
@pytest.mark.parametrize("name", list(FORMATS))
def test_the_ctranslate2_export_translates_as_the_model(prepared, tmp_path, name):
    """Greedy search of the same subwords, where neither stops at its length limit (CTranslate2's
    limit is not the source's multiple)."""
    import ctranslate2

    model = prepared(name)[0]
    assert cli("export", "-m", model, "--format", "ctranslate2", "-o", tmp_path / "ct2").exit_code == 0
    translator = Translator.load(model, device="cpu")
    pipeline = translator.engine.pipeline
    lines = multi30k_lines(20, "en", "val")
    sources = [pipeline.src_vocab.decode(pipeline.source_ids(line, k)) for k, line in enumerate(lines)]
    results = ctranslate2.Translator(str(tmp_path / "ct2")).translate_batch(sources, beam_size=1,
                                                                           max_decoding_length=256)
    _, found = translator.engine.search(lines, translator.search_config(beam=1))
    ended = [k for k, hyps in enumerate(found) if len(hyps[0].tokens) < 0.9 * len(sources[k]) + 5]
    assert len(ended) >= 5
    assert [results[k].hypotheses[0] for k in ended] == [pipeline.tgt_vocab.decode(found[k][0].tokens) for k in ended]
