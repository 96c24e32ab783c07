"""Bad input, as a table: each case gets a one-line error naming the file/line/option and cause,
a non-zero exit, and nothing half-written; or, where the input is usable, a clear warning."""

import gzip
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import EN_MG, tiny_checkpoint, write_lines

from nmt_cli.cli import main
from nmt_cli.model import checkpoint as ckpt


@dataclass
class Case:
    name: str
    setup: object  # (tmp_path) -> list of CLI arguments
    exit_code: int
    message: str
    absent: list = field(default_factory=list)  # paths (relative to tmp_path) that must not exist afterwards
    stdin: str | None = None


def corpus(tmp: Path, en: list[str], de: list[str]) -> list[str]:
    write_lines(tmp / "train.en", en)
    write_lines(tmp / "train.de", de)
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", str(tmp / "train"), "--destdir", str(tmp / "out"),
            "--bpe-merges", "5", "--workers", "1", "--quiet"]


GOOD = ["the cat sat", "a dog ran home", "cats and dogs"]


def mismatched_lines(tmp):
    return corpus(tmp, GOOD, GOOD[:2])


def invalid_utf8(tmp):
    args = corpus(tmp, GOOD, GOOD)
    (tmp / "train.de").write_bytes(b"die Katze\nein \xc3\x28 Hund\nKatzen\n")
    return args


def nul_and_huge_lines(tmp):
    return corpus(tmp, GOOD + ["a \x00 b", "x " * 500_000], GOOD + ["a b", "y"])


def duplicate_vocabulary(tmp):
    args = corpus(tmp, GOOD, GOOD)
    (tmp / "dict.txt").write_text("cat 3\ndog 2\ncat 1\n")
    return args + ["--srcdict", str(tmp / "dict.txt"), "--bpe-merges", "0"]


def translate(tmp, model, lines, *extra):
    write_lines(tmp / "in.txt", lines) if lines is not None else (tmp / "in.txt").write_text("")
    return ["translate", "-m", str(model), "-i", str(tmp / "in.txt"), "-o", str(tmp / "out.txt"), *extra]


def long_line_learned_positions(tmp):
    model = tiny_checkpoint(tmp / "m.pt", max_positions=6, positions="learned")
    return translate(tmp, model, ["a b", "a b c d e f g h i j", "c"])


def empty_input(tmp):
    return translate(tmp, tiny_checkpoint(tmp / "m.pt"), None)


def truncated_checkpoint(tmp):
    model = tiny_checkpoint(tmp / "m.pt")
    model.write_bytes(model.read_bytes()[:1000])
    return translate(tmp, model, ["a"])


def random_checkpoint(tmp):
    (tmp / "m.pt").write_bytes(bytes(range(256)) * 64)
    return translate(tmp, tmp / "m.pt", ["a"])


def other_format_version(tmp):
    model = tiny_checkpoint(tmp / "m.pt")
    checkpoint = ckpt.load(model)
    checkpoint["format_version"] = 3
    ckpt.save(checkpoint, model)
    return translate(tmp, model, ["a"])


def average_different_architectures(tmp):
    a, b = tiny_checkpoint(tmp / "a.pt"), tiny_checkpoint(tmp / "b.pt", heads=4)
    return ["average-checkpoints", "--inputs", str(a), "--inputs", str(b), "-o", str(tmp / "avg.pt")]


def invalid_utf8_to_translate(tmp):
    args = translate(tmp, tiny_checkpoint(tmp / "m.pt"), None)
    (tmp / "in.txt").write_bytes(b"a b\n\xff\n")
    return args


def data_dir(tmp, tamper=None):
    """`nmt train` on a synthetic data directory, after `tamper(data)`."""
    from conftest import synthetic_data_dir

    data = synthetic_data_dir(tmp / "d", n_train=40, n_valid=8)
    if tamper is not None:
        tamper(data)
    return ["train", str(data), "--save-dir", str(tmp / "ck"), "--arch", "small", "--encoder-layers", "1",
            "--decoder-layers", "1", "--d-model", "16", "--d-ff", "16", "--heads", "2", "--max-updates", "1",
            "--device", "cpu", "--quiet"]


def truncate(path):
    path.write_bytes(path.read_bytes()[:-2])


def drop_meta_key(data):
    meta = json.loads((data / "meta.json").read_text())
    del meta["dictionaries"]
    (data / "meta.json").write_text(json.dumps(meta))


def shorten_dictionary(data):
    lines = (data / "dict.src.txt").read_text().splitlines(keepends=True)
    (data / "dict.src.txt").write_text("".join(lines[:-3]))


def long_valid_line(data):
    from nmt_cli.corpus.data import ArrayWriter

    writer = ArrayWriter(data / "valid.src", np.dtype(json.loads((data / "meta.json").read_text())["dtype"]))
    for i in range(8):
        writer.add([5] * (2000 if i == 3 else 3))
    writer.close()
    meta = json.loads((data / "meta.json").read_text())  # checksums made right: only the length is wrong
    from nmt_cli.corpus.datadir import sha256

    meta["checksums"].update({name: sha256(data / name) for name in ("valid.src.bin", "valid.src.idx")})
    (data / "meta.json").write_text(json.dumps(meta))


def empty_valid_split(tmp):
    args = corpus(tmp, GOOD, GOOD)
    (tmp / "valid.en").write_text("")
    (tmp / "valid.de").write_text("")
    return args + ["--validpref", str(tmp / "valid")]


def destdir_under_a_file(tmp):
    (tmp / "file").write_text("mine")
    return [a if a != str(tmp / "out") else str(tmp / "file/out") for a in corpus(tmp, GOOD, GOOD)]


def malicious_checkpoint(tmp):
    import os

    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    torch.save({"format_version": 1, "model": Evil()}, tmp / "m.pt")
    return translate(tmp, tmp / "m.pt", ["a"])


def text_file_as_checkpoint(tmp):
    write_lines(tmp / "notes.txt", ["not a model"])
    return ["average-checkpoints", "--inputs", str(tmp / "notes.txt"), "-o", str(tmp / "avg.pt")]


def score_files(tmp, hyp: bytes, ref: bytes):
    (tmp / "hyp.txt").write_bytes(hyp)
    (tmp / "ref.txt").write_bytes(ref)
    return ["score", "-r", str(tmp / "ref.txt"), "-i", str(tmp / "hyp.txt")]


def truncated_gzip(tmp):
    """A gzipped training file cut in half (a download that stopped): gzip's EOFError."""
    text = "".join(f"line {i} of the corpus\n" for i in range(3000)).encode()
    packed = gzip.compress(text)
    (tmp / "train.en.gz").write_bytes(packed[: len(packed) // 2])
    (tmp / "train.de.gz").write_bytes(packed)
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", str(tmp / "train"), "--destdir", str(tmp / "out"),
            "--bpe-merges", "5", "--workers", "1", "--quiet"]


def curves_of(tmp, with_log: bool, output: str):
    (tmp / "run").mkdir()
    (tmp / "file").write_text("mine")
    if with_log:
        (tmp / "run/train_log.jsonl").write_text('{"kind": "train", "update": 1, "loss": 2.0, "nll": 1.9, "ppl": 6.7, '
                                                 '"elapsed_s": 1.0}\n')
    return ["plot", "curves", str(tmp / "run"), "-o", str(tmp / output)]


def option(*args):
    """Command-line arguments with a real model in place of MODEL."""
    return lambda tmp: [str(tiny_checkpoint(tmp / "x.pt")) if a == "MODEL" else a for a in args]


CASES = [
    Case("line counts differ", mismatched_lines, 1, r"train.de:3: file ends here, but .*train.en has more", ["out"]),
    Case("invalid UTF-8", invalid_utf8, 1, r"train.de:2: invalid UTF-8 \(byte 5", ["out"]),
    Case("NUL byte and 1 MB line are filtered and counted", nul_and_huge_lines, 0, ""),
    Case("vocabulary with duplicate entries", duplicate_vocabulary, 1, r"dict.txt:3: duplicate token 'cat'", ["out"]),
    Case("line longer than learned positions", long_line_learned_positions, 0,
         r"warning: line 2: 10 tokens, more than the model's 5; translating the first 5"),
    Case("empty input file", empty_input, 0, ""),
    Case("truncated checkpoint", truncated_checkpoint, 1, r"m.pt: unreadable or truncated checkpoint", ["out.txt"]),
    Case("random-bytes checkpoint", random_checkpoint, 1, r"m.pt: (unreadable|refused)", ["out.txt"]),
    Case("checkpoint of another format version", other_format_version, 1, r"m.pt: checkpoint format version 3",
         ["out.txt"]),
    Case("averaging different architectures", average_different_architectures, 1,
         r"a.pt and .*b.pt differ in heads \(2 vs 4\)", ["avg.pt"]),
    Case("invalid UTF-8 to translate", invalid_utf8_to_translate, 1, r"in.txt:2: invalid UTF-8", ["out.txt"]),
    Case("truncated training array", lambda t: data_dir(t, lambda d: truncate(d / "train.tgt.bin")), 1,
         r"train.tgt.bin: differs from the checksum in meta.json", ["ck/checkpoint_last.pt"]),
    Case("meta.json without a key", lambda t: data_dir(t, drop_meta_key), 1,
         r"meta.json: incomplete \(no 'dictionaries'\)", ["ck"]),
    Case("shortened dictionary", lambda t: data_dir(t, shorten_dictionary), 1, r"dict.src.txt: differs from the "
         "checksum", ["ck"]),
    Case("missing index file", lambda t: data_dir(t, lambda d: (d / "valid.tgt.idx").unlink()), 1,
         r"valid.tgt.idx: missing from the data directory", ["ck"]),
    Case("valid line longer than the model's positions", lambda t: data_dir(t, long_valid_line), 1,
         r"valid pair 4 has 2001 tokens .* more than --max-positions", ["ck/checkpoint_last.pt"]),
    Case("empty valid split", empty_valid_split, 1, r"valid.en: the valid split is empty", ["out"]),
    Case("meta.json that is not an object", lambda t: data_dir(t, lambda d: (d / "meta.json").write_text("[]")), 1,
         r"meta.json: data format version None", ["ck"]),
    Case("--destdir is a file", lambda t: (t / "out").write_text("mine") and corpus(t, GOOD, GOOD), 1,
         r"out: exists and is not a directory"),
    Case("--destdir under a file", destdir_under_a_file, 1, r"file: cannot write there", ["out"]),
    Case("translation into a missing directory",
         lambda t: translate(t, tiny_checkpoint(t / "m.pt"), ["a"])[:-1] + [str(t / "no/out.txt")], 1,
         r"out.txt: cannot write the translation \(no such directory"),
    Case("translation into a directory",
         lambda t: translate(t, tiny_checkpoint(t / "m.pt"), ["a"])[:-1] + [str(t)], 2, r"is a directory"),
    Case("checkpoint that would run code", malicious_checkpoint, 1,
         r"m.pt: refused to load: not a plain nmt-cli checkpoint \(unsupported GLOBAL (posix|os).system\)$",
         ["out.txt"]),
    Case("a text file to average", text_file_as_checkpoint, 1, r"notes.txt: (unreadable or truncated|refused to load)",
         ["avg.pt"]),
    Case("averaging into a missing directory",
         lambda t: ["average-checkpoints", "--inputs", str(tiny_checkpoint(t / "a.pt")), "-o", str(t / "no/avg.pt")],
         1, r"avg.pt: cannot write checkpoint \(No such file or directory\)"),
    Case("score: line counts differ", lambda t: score_files(t, b"a\n", b"a\nb\n"), 1, r"line counts differ"),
    Case("score: invalid UTF-8", lambda t: score_files(t, b"a\n", b"\xff\n"), 1, r"ref.txt:1: invalid UTF-8"),
    Case("score: two empty files", lambda t: score_files(t, b"", b""), 1, r"hyp.txt and .*ref.txt: no lines to score"),
    Case("truncated gzip file", truncated_gzip, 1, r"train.en.gz: a truncated or damaged gzip file", ["out"]),
    Case("plot: a directory without a training log", lambda t: curves_of(t, False, "c.png"), 1,
         r"train_log.jsonl: not found", ["c.png"]),
    Case("plot: output under a file", lambda t: curves_of(t, True, "file/c.png"), 1,
         r"file: cannot write the plot there"),
    Case("negative beam", option("translate", "-m", "MODEL", "--beam", "-1"), 2, r"'--beam'"),
    Case("zero max-tokens", option("train", ".", "--save-dir", "s", "--max-tokens", "0"), 2, r"'--max-tokens'"),
    Case("dropout >= 1", option("train", ".", "--save-dir", "s", "--dropout", "1"), 2, r"'--dropout'"),
    Case("negative length penalty", option("translate", "-m", "MODEL", "--lenpen", "-0.5"), 2, r"'--lenpen'"),
    Case("zero heads", option("info", "--heads", "0"), 2, r"'--heads'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, case.setup(tmp_path), input=case.stdin)
    assert result.exit_code == case.exit_code, result.output
    if case.exit_code == 1:
        assert len(result.output.strip().splitlines()) == 1, result.output  # one line, no traceback
        assert result.output.startswith("Error: ")
    if case.message:
        import re

        assert re.search(case.message, result.output.strip(), re.MULTILINE), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)  # no traceback
    assert "weights_only" not in result.output  # never PyTorch's advice to load a refused file unsafely
    for name in case.absent:
        assert not (tmp_path / name).exists(), name
    assert not list(tmp_path.glob(".*tmp-*"))


def test_filtered_lines_are_counted(tmp_path):
    CliRunner().invoke(main, nul_and_huge_lines(tmp_path))
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    assert meta["splits"]["train"]["dropped"] == {"nul_byte": 1, "too_long": 1}
    assert meta["splits"]["train"]["pairs_out"] == 3


@pytest.mark.slow
def test_a_full_stdout_is_one_line_and_a_closed_pipe_a_quiet_end(tmp_path):
    """`nmt translate > /dev/full` and `nmt translate | head -c 0`: no traceback, nothing that
    fails again as the interpreter exits."""
    model = tiny_checkpoint(tmp_path / "m.pt")
    command = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(model), "--beam", "1"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(command, input="a b\n" * 50, stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: <stdout>: cannot write the translation (No space left on device)"
    piped = subprocess.run(f"{' '.join(command)} | head -c 0; exit ${{PIPESTATUS[0]}}", shell=True,
                           executable="/bin/bash", input="a b\n" * 20000, capture_output=True, text=True)
    assert piped.returncode == 141 and piped.stderr == ""


def test_a_model_too_large_to_make_is_one_line_with_the_memory_it_needs(tmp_path, monkeypatch):
    """`--d-model 65536 --heads 1` is in the flags' ranges; PyTorch's allocator refuses the model
    (here made to refuse at once: a machine with more memory would first fill it)."""
    from nmt_cli.train import run as train

    def refused(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 51539607552 bytes")

    monkeypatch.setattr(train, "Transformer", refused)
    args = data_dir(tmp_path)
    args[args.index("--d-model") + 1], args[args.index("--heads") + 1] = "65536", "1"
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "the model cannot be made" in result.output and "GiB in float32" in result.output


def writers(tmp_path):
    """Each command that writes a file a user names, as arguments ending in its output path."""
    model = str(tiny_checkpoint(tmp_path / "m.pt"))
    source = write_lines(tmp_path / "in.txt", ["a b", "c"])
    return {"translate": ["translate", "-m", model, "-i", str(source), "--beam", "1", "-o"],
            "average-checkpoints": ["average-checkpoints", "--inputs", model, model, "-o"],
            "export safetensors": ["export", "-m", model, "--format", "safetensors", "-o"]}


@pytest.mark.parametrize("command", ["translate", "average-checkpoints", "export safetensors"])
def test_an_output_path_is_never_replaced_by_something_else(tmp_path, command):
    """A device or FIFO is refused (a rename would have replaced /dev/null by a text file), a
    hard-linked file too (a rename would part it from its other names); a symbolic link is
    followed: its target is written, atomically, and the link stays."""
    import os
    import stat

    args = writers(tmp_path)[command]
    suffix = ".safetensors" if command.startswith("export") else ".out"
    fifo, target, link = tmp_path / f"fifo{suffix}", tmp_path / f"target{suffix}", tmp_path / f"link{suffix}"
    os.mkfifo(fifo)
    for path, kind in (("/dev/null", "a character device"), (str(fifo), "a FIFO")):
        result = CliRunner().invoke(main, [*args, path])
        assert result.exit_code == 1 and f"{path}: {kind}, not a regular file" in result.output, result.output
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)
    link.symlink_to(target.name)
    assert CliRunner().invoke(main, [*args, str(link)]).exit_code == 0
    assert link.is_symlink() and target.is_file() and target.stat().st_size > 0
    hard = tmp_path / f"hard{suffix}"
    os.link(target, hard)
    result = CliRunner().invoke(main, [*args, str(hard)])
    assert result.exit_code == 1 and "a file with 1 other hard link(s)" in result.output, result.output
    assert os.path.samefile(target, hard)


def own_inputs(tmp: Path) -> dict[str, list[str]]:
    """Each writing command, with -o (or its output) one of the inputs it reads: a file read, a file
    inside a directory it reads, a directory that holds what it reads, a link to an input."""
    from conftest import opus_mt_release, synthetic_data_dir

    model = str(tiny_checkpoint(tmp / "m.pt"))
    source = str(write_lines(tmp / "in.txt", ["a b", "c"]))
    data = synthetic_data_dir(tmp, n_train=20, n_valid=4)
    (tmp / "link.txt").symlink_to("in.txt")
    (tmp / "ck").mkdir()
    (tmp / "ck/train_log.jsonl").write_text('{"kind": "train", "update": 1, "loss": 1.0, "ppl": 2.0}\n')
    cases = {
        "translate over its input": ["translate", "-m", model, "-i", source, "-o", source],
        "translate over its model": ["translate", "-m", model, "-i", source, "-o", model],
        "translate through a link": ["translate", "-m", model, "-i", source, "-o", str(tmp / "link.txt")],
        "average over an input": ["average-checkpoints", "--inputs", model, model, "-o", model],
        "shortlist into its data": ["shortlist", str(data), "-o", str(data / "train.tgt.bin")],
        "export over the model's directory": ["export", "-m", model, "--format", "ctranslate2", "-o", str(tmp)],
        "plot over the log": ["plot", "curves", str(tmp / "ck"), "-o", str(tmp / "ck/train_log.jsonl")],
    }
    if (EN_MG / "config.json").is_file():
        opus_mt_release(tmp / "release")
        cases["import into the release"] = ["import", str(tmp / "release"), "-o", str(tmp / "release/config.json")]
    return cases


OWN_INPUTS = ["translate over its input", "translate over its model", "translate through a link",
              "average over an input", "shortlist into its data", "export over the model's directory",
              "plot over the log", "import into the release"]


@pytest.mark.parametrize("name", OWN_INPUTS)
def test_an_output_that_is_one_of_the_commands_inputs_is_refused_before_anything_is_read(tmp_path, name):
    """nmt import SRC -o SRC/config.json, nmt translate -i a -o a, ...: one line naming the input,
    and every file as it was."""
    cases = own_inputs(tmp_path)
    if name not in cases:
        pytest.skip(f"opus-mt-en-mg not found at {EN_MG} (set NMT_SHARED_DATA)")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    result = CliRunner().invoke(main, cases[name])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "the input" in result.output and "would destroy it; choose another path" in result.output
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before
