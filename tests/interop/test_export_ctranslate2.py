"""`nmt export`: safetensors round trips byte-identically; CTranslate2 gives our log-probabilities,
and our outputs where the search rules coincide: greedy search, for non-empty outputs that end
with </s> (at the length limit we add </s> and count it, CTranslate2 cuts the hypothesis; it
does not end before a first token). Beam search without a length penalty agrees on most."""

import json
import os
import resource
import signal
import stat
import struct
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from conftest import NEEDS_CTRANSLATE2, block_import, synthetic_data_dir, tiny_checkpoint

from nmt_cli.cli import main
from nmt_cli.config import SearchConfig, TrainConfig
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import beam_search
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.architecture import PRESETS
from nmt_cli.text.vocab import EOS_ID, PAD_ID
from nmt_cli.train.run import TrainingRun

LINES = ["a b c d", "p o n m l k", "e", "f g h i j k l m n o p a b c", "c c c", "h a"]
SYMBOLS = list("abcdefghijklmnop")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_safetensors_round_trip_translates_byte_identically(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt", seed=5)
    assert run("export", "-m", model, "--format", "safetensors", "-o", tmp_path / "m.safetensors").exit_code == 0
    outputs = []
    for path in (model, tmp_path / "m.safetensors"):
        result = CliRunner().invoke(main, ["translate", "-m", str(path), "--device", "cpu", "--format", "jsonl",
                                           "--beam", "3", "--nbest", "2"], input="\n".join(LINES) + "\n")
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    assert outputs[0] == outputs[1]
    raw = (tmp_path / "m.safetensors").read_bytes()  # the header is JSON: any language can read it
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    description = json.loads(header["__metadata__"]["nmt_cli"])
    assert description["src_vocab"][4:] == SYMBOLS and description["shared_vocab"] is True
    stored = [name for name in ("src_embed.tokens.weight", "tgt_embed.tokens.weight") if name in header]
    assert len(stored) == 1  # one matrix for source, target and projection (3-way tying): stored once


def test_not_an_nmt_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    result = run("translate", "-m", tmp_path / "x.safetensors")
    assert result.exit_code == 1 and "without nmt-cli's description" in result.output
    (tmp_path / "y.safetensors").write_bytes(b"garbage")
    result = run("translate", "-m", tmp_path / "y.safetensors")
    assert result.exit_code == 1 and "not a readable safetensors file" in result.output


@pytest.mark.parametrize("description, message", [
    ("{not json", "nmt-cli's description in it is damaged"),
    ('{"format_version": 99}', "checkpoint format version 99"),
    ('["a list"]', "nmt-cli's description in it is damaged"),
])
def test_a_damaged_or_newer_description_is_refused(tmp_path, description, message):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "x.safetensors"), metadata={"nmt_cli": description})
    result = run("translate", "-m", tmp_path / "x.safetensors")
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1


def trained(tmp_path, variant: dict, shared: bool) -> ckpt.ModelBundle:
    """A tiny model trained for a few seconds to copy its input (in capitals with separate
    vocabularies): its outputs end with </s>."""
    data = synthetic_data_dir(tmp_path, n_train=300, n_valid=20, task="copy" if shared else "upper",
                              joined_dictionary=shared)
    model = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
                                     max_positions=64, **variant)
    config = TrainConfig(max_tokens=400, lr_schedule="inverse-sqrt", lr=3e-3, warmup=30, max_updates=60,
                         device="cpu", threads=1, save_interval_minutes=1000.0)
    TrainingRun(data, tmp_path / "ck", model, config, progress_bar=False).run()
    return ckpt.load_bundle(tmp_path / "ck/checkpoint_last.pt")


VARIANTS = [({}, True), ({"norm": "pre"}, True), ({"positions": "learned"}, False),
            ({"norm": "pre", "positions": "learned", "decoder_start": "eos"}, False), ({"embedding_norm": True}, True)]


@pytest.mark.parametrize("variant, shared", VARIANTS)
@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_ctranslate2_scores_and_searches_like_us(tmp_path, variant, shared):
    import ctranslate2

    from nmt_cli.interop.export_ctranslate2 import save_ctranslate2

    bundle = trained(tmp_path, variant, shared)
    assert (bundle.src_vocab is bundle.tgt_vocab) == shared
    save_ctranslate2(bundle, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", compute_type="float32")
    sources = [line.split() for line in (tmp_path / "raw/valid.src").read_text().splitlines()]
    src = [bundle.src_vocab.encode(s) + [EOS_ID] for s in sources]
    padded = torch.tensor([row + [PAD_ID] * (max(map(len, src)) - len(row)) for row in src])
    for beam in (1, 4):  # greedy, and beam search without a length penalty: both rank by log-probability
        config = SearchConfig(beam=beam, lenpen=0.0, max_len_a=1, max_len_b=5)
        mine = [h[0] for h in beam_search(Ensemble([bundle.model]), padded, config)]
        results = translator.translate_batch(sources, beam_size=beam, length_penalty=0.0, disable_unk=True,
                                             max_decoding_length=64, suppress_sequences=[["<s>"], ["<pad>"]])
        ended = [k for k, h in enumerate(mine) if 0 < len(h.tokens) < len(sources[k]) + 5]  # by </s>
        assert len(ended) >= len(sources) // 2
        same = [bundle.tgt_vocab.decode(mine[k].tokens) == results[k].hypotheses[0] for k in ended]
        # greedy takes the same token at every step; CTranslate2's beam search renormalizes the
        # probabilities after suppressing tokens (we do not), which can reorder close hypotheses
        assert all(same) if beam == 1 else sum(same) >= 0.75 * len(same)
    # the model's log-probability of each token of those outputs (and their </s>)
    scored = translator.score_batch(sources, [bundle.tgt_vocab.decode(h.tokens) for h in mine])
    for h, theirs in zip(mine, scored):
        assert sum(theirs.log_probs) == pytest.approx(h.log_prob, abs=1e-3)


@NEEDS_CTRANSLATE2
def test_export_writes_the_text_pipeline_and_refuses_what_ctranslate2_cannot_hold(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    result = run("export", "-m", model, "--format", "ctranslate2", "-o", tmp_path / "ct2", "--quantization", "int8")
    assert result.exit_code == 0, result.output
    about = json.loads((tmp_path / "ct2/nmt-cli.json").read_text())
    assert about["text_config"]["tokenizer"] == "none" and (tmp_path / "ct2/model.bin").is_file()
    odd = tiny_checkpoint(tmp_path / "odd.pt", d_k=8, d_v=8)  # d_model 32, 2 heads: d_k would be 16
    result = run("export", "-m", odd, "--format", "ctranslate2", "-o", tmp_path / "odd")
    assert result.exit_code == 1 and "CTranslate2 needs d_k = d_v = d_model / heads" in result.output
    result = run("export", "-m", model, "--format", "safetensors", "-o", tmp_path / "m.bin")
    assert result.exit_code == 2 and "ends in .safetensors" in result.output


@NEEDS_CTRANSLATE2
def test_export_replaces_only_an_earlier_export_and_never_leaves_half_a_directory(tmp_path, monkeypatch):
    from nmt_cli.interop import export_ctranslate2 as export

    model, out = tiny_checkpoint(tmp_path / "m.pt"), tmp_path / "ct2"
    for _ in range(2):  # the second replaces the first
        result = run("export", "-m", model, "--format", "ctranslate2", "-o", out)
        assert result.exit_code == 0, result.output
    weights = (out / "model.bin").read_bytes()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    for target in (mine, tmp_path / "file"):
        result = run("export", "-m", model, "--format", "ctranslate2", "-o", target)
        assert result.exit_code == 1 and f"{target}:" in result.output and "choose another --output" in result.output
    assert (mine / "notes.txt").read_text() == "mine" and (tmp_path / "file").read_text() == "mine"
    result = run("export", "-m", model, "--format", "ctranslate2", "-o", tmp_path / "file/ct2")  # no directory there
    assert result.exit_code == 1 and f"{tmp_path / 'file'}: cannot write there (" in result.output

    def full(_bundle, _out):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "text_files", full)
    result = run("export", "-m", model, "--format", "ctranslate2", "-o", out, "--quantize", "int8")  # its other name
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {out}: cannot write the model directory (No space left on device); " \
                                    "nothing was written"
    assert (out / "model.bin").read_bytes() == weights  # the earlier export, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "file", "m.pt", "mine"]


@pytest.mark.parametrize("package, command, message", [
    ("ctranslate2", ["export", "--format", "ctranslate2", "-o", "OUT"], "needs CTranslate2: pip install"),
    ("safetensors", ["export", "--format", "safetensors", "-o", "OUT.safetensors"], "need the safetensors package"),
    ("onnxscript", ["export", "--format", "onnx", "-o", "OUT"], "--format onnx needs onnx and onnxscript: pip install"),
    ("uvicorn", ["serve"], "nmt serve needs its extra (uvicorn is missing): pip install 'nmt-cli[serve]'"),
    ("fastapi", ["serve"], "nmt serve needs its extra (fastapi"),  # fastapi_offline, the first to import it
])
def test_a_missing_optional_package_is_named_with_how_to_install_it(tmp_path, monkeypatch, package, command, message):
    model = tiny_checkpoint(tmp_path / "m.pt")
    block_import(monkeypatch, package)
    args = [str(tmp_path / a) if a.startswith("OUT") else a for a in command]
    result = run(*args, "-m", model, *(["--device", "cpu"] if command == ["serve"] else []))
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1


def test_a_safetensors_export_has_the_usual_mode_and_clears_what_a_killed_one_left(tmp_path):
    from nmt_cli.files import HOST

    model, out = tiny_checkpoint(tmp_path / "m.pt"), tmp_path / "m.safetensors"
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process id that no longer runs: an export killed by SIGKILL
    stale = tmp_path / f".m.safetensors.nmt-tmp-{HOST}-{dead.pid}-0123456789abcdef"
    stale.write_bytes(b"\0" * 1000)
    umask = os.umask(0o022)
    try:
        assert run("export", "-m", model, "--format", "safetensors", "-o", out).exit_code == 0
    finally:
        os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "m.safetensors"]


def test_a_safetensors_export_to_a_full_disk_says_one_line_and_leaves_nothing(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    done = subprocess.run([sys.executable, "-m", "nmt_cli", "export", "-m", str(model), "--format", "safetensors",
                           "-o", str(tmp_path / "m.safetensors")], capture_output=True, text=True,
                          preexec_fn=small_files)
    assert done.returncode == 1 and done.stderr.strip() == \
        f"Error: {tmp_path / 'm.safetensors'}: cannot write safetensors file (File too large)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


@NEEDS_CTRANSLATE2
def test_an_export_over_the_current_directory_is_refused(tmp_path, monkeypatch):
    model = tiny_checkpoint(tmp_path / "m.pt")
    empty = tmp_path / "above/here"
    empty.mkdir(parents=True)
    monkeypatch.chdir(empty)
    for out in (".", str(tmp_path / "above")):
        result = run("export", "-m", model, "--format", "ctranslate2", "-o", out)
        assert result.exit_code == 1 and "is the current directory or holds it; choose a new --output" in \
            result.output and "Traceback" not in result.output
    assert empty.is_dir() and not list(empty.iterdir())
