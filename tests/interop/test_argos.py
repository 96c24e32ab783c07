"""`nmt export --format argos` and `nmt import` of an Argos package, with argostranslate itself
(argos-translate-lt 1.12.1, which LibreTranslate 1.9.6 pins) installed from PyPI into a virtual
environment of its own: the package installs and translates offline, sentence by sentence as
MiniSBD splits a paragraph with the package's own splitter, equal to `nmt translate` with Argos's
search; the package comes back through `nmt import` bit for bit (float32) or as CTranslate2
computes (int8); an imported package fine-tunes and goes out again; bad packages and bad
requests are one line."""

import contextlib
import json
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from argos_client import environment, joined, sentences
from argos_client import translate as argos
from click.testing import CliRunner
from conftest import (
    NEEDS_CTRANSLATE2,
    built_once,
    cli,
    free_port,
    multi30k_lines,
    request,
    serving,
    synthetic_pairs,
    tiny_checkpoint,
    tiny_sentencepiece_checkpoint,
    write_lines,
)

from nmt_cli.cli import main
from nmt_cli.interop.export_argos import ARGOS_FLAGS, ARGOS_SEARCH
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def as_argos(model: Path, texts: list[str], split: list[list[list[str]]]) -> list[str]:
    """What Argos makes of each text with `model` searched as Argos does (ARGOS_FLAGS): each of its
    sentences (`split`) translated, then joined as argostranslate joins them."""
    flat = write_lines(model.parent / "argos-sentences.txt", [s for text in split for paragraph in text
                                                              for s in paragraph])
    out = flat.with_suffix(".out")
    result = run("translate", "-m", model, "--device", "cpu", *ARGOS_FLAGS.split(), "-i", flat, "-o", out)
    assert result.exit_code == 0, result.output
    return joined(out.read_text(encoding="utf-8").splitlines(), split)


def splits(package: Path, texts: list[str], where: Path) -> list[list[list[str]]]:
    pytest.importorskip("minisbd", reason="MiniSBD (argostranslate's splitter) is in the dev extra")
    return sentences(package, texts, where)


def train_copy_model(tmp: Path, task: str = "copy", init_from: Path | None = None,
                     pairs: dict[str, list[tuple[str, str]]] | None = None,
                     text: tuple[object, ...] = ("--subword", "sentencepiece", "--vocab-size", 40)) -> Path:
    """A tiny model trained for seconds on letters (`task`), or on `pairs` by split, positions enough
    for Argos's 256 output tokens, its text pipeline `text` (preprocess's flags); `init_from`:
    fine-tuned from that checkpoint, on data made with its text pipeline."""
    from nmt_cli.config import TrainConfig
    from nmt_cli.model.architecture import PRESETS
    from nmt_cli.train.run import TrainingRun

    raw = tmp / "raw"
    raw.mkdir(parents=True)
    pairs = pairs or {split: synthetic_pairs(n, seed, task) for split, n, seed in (("train", 400, 0),
                                                                                    ("valid", 40, 1000))}
    for split, split_pairs in pairs.items():
        write_lines(raw / f"{split}.src", [s for s, _ in split_pairs])
        write_lines(raw / f"{split}.tgt", [t for _, t in split_pairs])
    given = ["--from-model", init_from] if init_from else text
    result = cli("preprocess", "-s", "src", "-t", "tgt", "--trainpref", raw / "train", "--validpref", raw / "valid",
                 "--destdir", tmp / "data", *given, "--quiet", "--workers", 1)
    assert result.exit_code == 0, result.output
    model = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
                                     max_positions=300)
    config = TrainConfig(max_tokens=400, lr_schedule="inverse-sqrt", lr=3e-3, warmup=30,
                         max_updates=200 if init_from else 400, device="cpu", threads=1, save_interval_minutes=1000.0,
                         validate_interval_updates=50)
    TrainingRun(tmp / "data", tmp / "ck", model, config, progress_bar=False, init_from=init_from).run()
    return tmp / "ck" / "checkpoint_last.pt"


def build_packages(tmp: Path) -> None:
    model = train_copy_model(tmp)
    for quantization in ("float32", "int8"):
        result = cli("export", "-m", model, "--format", "argos", "-o", tmp / f"{quantization}.argosmodel",
                     "--quantize", quantization, "--sentences", tmp / "raw/train.src")
        assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The trained model (ck/checkpoint_last.pt), its raw data and its packages (float32, int8)."""
    return built_once(tmp_path_factory, "argos-packages", build_packages)


@NEEDS_CTRANSLATE2
def test_the_package_holds_what_argostranslate_reads(packages):
    with zipfile.ZipFile(packages / "int8.argosmodel") as z:
        names = z.namelist()
        (folder,) = {name.split("/")[0] for name in names}
        metadata = json.loads(z.read(f"{folder}/metadata.json"))
        splitter = z.read(f"{folder}/minisbd/src.onnx")
    assert folder == "translate-src_tgt-1_0"
    assert {f"{folder}/{n}" for n in ("model/model.bin", "model/config.json", "sentencepiece.model", "README.md",
                                      "model/shared_vocabulary.json")} <= set(names)
    assert metadata | {"links": []} == {"package_version": "1.0", "argos_version": "1.9.0", "from_code": "src",
                                        "from_name": "src", "to_code": "tgt", "to_name": "tgt", "type": "translate",
                                        "links": []}
    import onnx

    graph = onnx.load_from_string(splitter)
    assert [i.name for i in graph.graph.input] == ["units", "features"]
    meta = {p.key: p.value for p in graph.metadata_props}
    assert json.loads(meta["config"])["feat_funcs"][0] == "space_before" and meta["lexicon"] == "null"
    assert json.loads(meta["vocab"])["_id2unit"][:2] == ["<PAD>", "<UNK>"]


def random_model(path: Path, seed: int) -> Path:
    """An untrained SentencePiece model whose outputs vary in length up to Argos's limit: random
    output biases, </s> less likely, and none for <pad>, <s> and <unk> (which CTranslate2 would
    output, and nmt-cli never does)."""
    model = tiny_sentencepiece_checkpoint(path, seed=seed, max_positions=300, output_bias=True)
    checkpoint = ckpt.load(model)
    bias = checkpoint["model"]["output_projection.bias"]
    with torch.no_grad():
        bias.copy_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(seed)))
        bias[[PAD_ID, BOS_ID, UNK_ID]] = -1e4
        bias[EOS_ID] = 0.5
    ckpt.save(checkpoint, model)
    return model


@NEEDS_CTRANSLATE2
def test_argos_search_is_ctranslate2s_as_argostranslate_calls_it(tmp_path):
    """ARGOS_SEARCH against CTranslate2's translate_batch with argostranslate's arguments, on
    models whose outputs end anywhere between 1 and 256 tokens: every line alike, where GNMT's length
    penalty differs on some. Both with no minimum length: CTranslate2 forbids </s> at the
    first step before its softmax (nmt-cli after), a constant per sentence that reorders outputs
    of different lengths only where a first </s> was probable, as here and not in a trained model."""
    import ctranslate2
    import sentencepiece

    from nmt_cli.decode.translator import Translator
    from nmt_cli.interop.export_ctranslate2 import save_ctranslate2

    lines = [s for s, _ in synthetic_pairs(40, 7, "copy")]
    same, other, lengths = 0, 0, set()
    for seed in range(3):
        model = random_model(tmp_path / f"m{seed}.pt", seed)
        save_ctranslate2(ckpt.load_bundle(model), tmp_path / f"ct2-{seed}", "float32")
        pieces = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / f"ct2-{seed}" / "spm.model"))
        found = ctranslate2.Translator(str(tmp_path / f"ct2-{seed}"), device="cpu").translate_batch(
            [pieces.encode(line, out_type=str) for line in lines], replace_unknowns=True, max_batch_size=32,
            batch_type="tokens", beam_size=4, num_hypotheses=1, length_penalty=0.2, min_decoding_length=0)
        theirs = [pieces.decode_pieces(result.hypotheses[0]) for result in found]
        translator = Translator.load(model, device="cpu")
        search = {**ARGOS_SEARCH, "min_len": 0}
        same += sum(a == b for a, b in zip(translator.translate(lines, **search), theirs))
        other += sum(a == b for a, b in zip(translator.translate(lines, **{**search, "lenpen_form": "gnmt"}), theirs))
        lengths |= {len(line) for line in theirs}
    assert len(lengths) >= 8 and max(lengths) > 200  # outputs of many lengths, some cut at the limit
    assert same == 3 * len(lines) and other < same


@NEEDS_CTRANSLATE2
def test_argostranslate_translates_as_nmt_translate_with_argos_search(packages, argos_python, tmp_path):
    """Every validation line, and paragraphs of several lines (sentences as MiniSBD splits them,
    paragraphs as newlines split them), from an fp32 package; the int8 package translates too."""
    lines = (packages / "raw/valid.src").read_text().splitlines()
    texts = lines + [" ".join(lines[i:i + 3]) for i in range(0, 12, 3)] + ["\n".join(lines[20:23])]
    found = argos(argos_python, [packages / "float32.argosmodel"], texts, tmp_path / "fp32")
    sentences = splits(packages / "float32.argosmodel", texts, tmp_path)
    expected = as_argos(packages / "ck/checkpoint_last.pt", texts, sentences)
    same = sum(a == b for a, b in zip(found, expected))
    assert same >= 0.99 * len(texts), [(a, b) for a, b in zip(found, expected) if a != b]
    assert sum(found[k] == lines[k] for k in range(len(lines))) > len(lines) // 2  # it copies
    assert any(len(paragraph) > 1 for text in sentences for paragraph in text)  # paragraphs were split
    assert all(argos(argos_python, [packages / "int8.argosmodel"], lines[:5], tmp_path / "int8"))


@NEEDS_CTRANSLATE2
def test_a_package_comes_back_through_import(packages, tmp_path):
    """float32: bit for bit, with Argos's search; from the file and from an installed package's
    folder alike."""
    result = run("import", packages / "float32.argosmodel", "-o", tmp_path / "back.pt")
    assert result.exit_code == 0 and "note: the text pipeline: " in result.output and "nmt-cli.json" in result.output
    with zipfile.ZipFile(packages / "float32.argosmodel") as z:
        z.extractall(tmp_path / "installed")
    assert run("import", tmp_path / "installed" / "translate-src_tgt-1_0", "-o", tmp_path / "folder.pt").exit_code == 0
    original = ckpt.load(packages / "ck/checkpoint_last.pt")
    for path in (tmp_path / "back.pt", tmp_path / "folder.pt"):
        back = ckpt.load(path)
        assert back["model_config"] == original["model_config"] and back["text_config"] == original["text_config"]
        assert back["released"]["search"] == ARGOS_SEARCH  # a package searches as Argos does
        assert all(torch.equal(back["model"][name], tensor) for name, tensor in original["model"].items())


def both_ways(package: Path, out: Path) -> Path:
    """The package again as the other direction's (its metadata's codes swapped): LibreTranslate
    downloads models at its start unless two packages are installed."""
    with zipfile.ZipFile(package) as z, zipfile.ZipFile(out, "w") as reverse:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename.endswith("/metadata.json"):
                metadata = json.loads(data)
                metadata["from_code"], metadata["to_code"] = metadata["to_code"], metadata["from_code"]
                data = json.dumps(metadata).encode()
            reverse.writestr(info.filename.replace("translate-", "reverse-"), data)
    return out


@contextlib.contextmanager
def libretranslate(python: Path, argos_python: Path, package: Path, where: Path) -> Iterator[str]:
    """LibreTranslate, unmodified, on 127.0.0.1 with `package` installed (--load-only its pair), no
    network; yields its URL."""
    where.mkdir(parents=True, exist_ok=True)
    argos(argos_python, [package, both_ways(package, where / "reverse.argosmodel")], [], where)
    port, log = free_port(), where / "libretranslate.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(python.parent / "libretranslate"), "--host", "127.0.0.1", "--port", str(port),
                                    "--load-only", "src,tgt"], env=environment(where), stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if request(url + "/languages")[0] == 200:
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_libretranslate_and_nmt_serve_give_the_packages_lines(packages, libretranslate_python, argos_python,
                                                               tmp_path):
    """LibreTranslate 1.9.6 serving the fp32 package, called with libretranslatepy, translates as
    argostranslate does; `nmt serve` of the imported package gives the same lines through the same
    client where MiniSBD keeps a line whole (nmt serve translates lines, not sentences)."""
    from libretranslatepy import LibreTranslateAPI

    package = packages / "float32.argosmodel"
    lines = (packages / "raw/valid.src").read_text().splitlines()[:20]
    with libretranslate(libretranslate_python, argos_python, package, tmp_path / "lt") as url:
        theirs = [LibreTranslateAPI(url).translate(line, "src", "tgt") for line in lines]
    assert theirs == as_argos(packages / "ck/checkpoint_last.pt", lines, splits(package, lines, tmp_path))
    assert run("import", package, "-o", tmp_path / "imported.pt").exit_code == 0
    _, url, _ = serving(tmp_path, model=tmp_path / "imported.pt")
    ours = [LibreTranslateAPI(url).translate(line, "src", "tgt") for line in lines]
    whole = [k for k, text in enumerate(splits(package, lines, tmp_path)) if len(text[0]) == 1]
    assert len(whole) > len(lines) // 2 and [ours[k] for k in whole] == [theirs[k] for k in whole]


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_a_package_fine_tunes_and_libretranslate_serves_it(packages, libretranslate_python, argos_python, tmp_path):
    """An int8 package, as published ones are: imported, fine-tuned on another task (its validation
    loss falls), exported again, and LibreTranslate translates with the new package as nmt does."""
    from libretranslatepy import LibreTranslateAPI

    imported = tmp_path / "imported.pt"
    result = run("import", packages / "int8.argosmodel", "-o", imported)
    assert result.exit_code == 0, result.output
    tuned = train_copy_model(tmp_path / "tune", "reverse", init_from=imported)
    log = [json.loads(line) for line in (tmp_path / "tune/ck/train_log.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in log if row["kind"] == "valid"]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    package = tmp_path / "tuned.argosmodel"
    result = run("export", "-m", tuned, "--format", "argos", "-o", package, "--quantize", "float32", "--sentences",
                 tmp_path / "tune/raw/train.src")
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "tune/raw/valid.src").read_text().splitlines()[:20]
    with libretranslate(libretranslate_python, argos_python, package, tmp_path / "lt") as url:
        theirs = [LibreTranslateAPI(url).translate(line, "src", "tgt") for line in lines]
    assert theirs == as_argos(tuned, lines, splits(package, lines, tmp_path))
    reversed_lines = sum(a == " ".join(reversed(b.split())) for a, b in zip(theirs, lines))
    assert reversed_lines > sum(a == b for a, b in zip(theirs, lines))  # it learned to reverse, not to copy


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_a_moses_and_bpe_model_goes_out_as_argos_reads_it(argos_python, tmp_path):
    """Argos' other text pipeline, `bpe.model`: sacremoses' normalizer and tokenizer with their
    defaults (escaping, no tag protection), then subword-nmt; a model trained on exactly that is
    exported with it, and argostranslate translates real text with it as nmt does."""
    english = multi30k_lines(330, "en")
    pairs = {"train": [(line, line) for line in english[:300]], "valid": [(line, line) for line in english[300:]]}
    model = train_copy_model(tmp_path / "m", pairs=pairs, text=("--escape", "--no-protect-tags", "--bpe-merges", 300))
    package = tmp_path / "bpe.argosmodel"
    result = run("export", "-m", model, "--format", "argos", "-o", package, "--quantize", "float32", "--sentences",
                 tmp_path / "m/raw/train.src")
    assert result.exit_code == 0, result.output
    with zipfile.ZipFile(package) as z:
        assert any(name.endswith("/bpe.model") for name in z.namelist())
    lines = english[300:] + ["Tom's dog & the cat's <b>ball</b> [red] | \"big\" -- 3.5% ..."]
    found = argos(argos_python, [package], lines, tmp_path / "argos")
    assert found == as_argos(model, lines, splits(package, lines, tmp_path))


@NEEDS_CTRANSLATE2
def test_what_argos_cannot_run_is_refused_in_one_line(tmp_path):
    sentences = write_lines(tmp_path / "s.txt", ["a b c", "d e"])
    pieces = tiny_sentencepiece_checkpoint(tmp_path / "sp.pt", max_positions=300)
    cases = [
        ([pieces, "-o", tmp_path / "p.argosmodel"], "give --sentences FILE"),
        ([pieces, "-o", tmp_path / "p.zip", "--sentences", sentences],
         "an Argos Translate package ends in .argosmodel"),
        ([tiny_sentencepiece_checkpoint(tmp_path / "short.pt"), "-o", tmp_path / "p.argosmodel", "--sentences",
          sentences], "Argos outputs up to 256 tokens, and this model's positions end at 63"),
        ([tiny_checkpoint(tmp_path / "words.pt", max_positions=300), "-o", tmp_path / "p.argosmodel", "--sentences",
          sentences], "train on `nmt preprocess --subword sentencepiece` data"),
        ([pieces, "-o", tmp_path / "p.argosmodel", "--sentences", write_lines(tmp_path / "blank.txt", [" ", ""])],
         "blank.txt: no text to train the sentence splitter on"),
        ([with_language_codes(tmp_path / "codes.pt"), "-o", tmp_path / "p.argosmodel", "--sentences", sentences],
         "an Argos package translates one pair, and this model takes a >>code<< before each line"),
    ]
    for args, message in cases:
        result = run("export", "--format", "argos", "-m", *args)
        assert result.exit_code != 0 and message in result.output, result.output
        assert "Traceback" not in result.output
    (tmp_path / "mine.argosmodel").write_text("a user's file")
    result = run("export", "--format", "argos", "-m", pieces, "-o", tmp_path / "mine.argosmodel", "--sentences",
                 sentences)
    assert result.exit_code == 1 and "exists and is not an Argos package" in result.output
    assert (tmp_path / "mine.argosmodel").read_text() == "a user's file"
    result = run("export", "--format", "ctranslate2", "-m", pieces, "-o", tmp_path / "ct2", "--sentences", sentences)
    assert result.exit_code == 2 and "--sentences applies only to --format argos" in result.output


def with_language_codes(path: Path) -> Path:
    """A SentencePiece model whose lines start with a >>code<< (a multilingual one's text)."""
    checkpoint = ckpt.load(tiny_sentencepiece_checkpoint(path, max_positions=300))
    checkpoint["text_config"]["language_codes"] = True
    ckpt.save(checkpoint, path)
    return path


def package(path: Path, entries: dict[str, bytes], links: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16  # a symbolic link
            z.writestr(info, "/etc/passwd")
    return path


META = json.dumps({"from_code": "en", "to_code": "de"}).encode()


@pytest.mark.parametrize("entries, links, message", [
    ({"p/metadata.json": META, "p/../evil": b"x"}, (), "points outside the package's folder"),
    ({"p/metadata.json": META}, ("p/model",), "is a link"),
    ({"p/metadata.json": META, "q/other": b"x"}, (), "not one folder"),
    ({"p/metadata.json": META}, (), "no model/model.bin"),
    ({"p/metadata.json": json.dumps({"from_code": "en", "to_code": "de", "target_prefix": "__de__"}).encode(),
      "p/model/model.bin": b""}, (), "a multilingual package (target_prefix '__de__')"),
    ({"p/metadata.json": b"[1]", "p/model/model.bin": b""}, (), "its metadata.json is not a JSON object"),
    ({"p/metadata.json": json.dumps({"to_code": "de"}).encode()}, (), "metadata.json names no from_code: give -s"),
    ({"p/metadata.json": json.dumps({"from_code": "en", "to_code": "de", "type": "sbd"}).encode()}, (),
     "a package of type 'sbd', not a translation model"),
])
def test_a_bad_package_is_refused_in_one_line(tmp_path, entries, links, message):
    path = package(tmp_path / "bad.argosmodel", entries, links)
    result = run("import", path, "-o", tmp_path / "out.pt")
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out.pt").exists() and not (tmp_path / "evil").exists()
