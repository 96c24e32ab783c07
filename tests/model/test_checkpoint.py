"""Checkpoints: safe loading, bad files, averaging."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_checkpoint

from nmt_cli.cli import main
from nmt_cli.errors import NmtError
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.model.averaging import average
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.train.savedir import last_checkpoints


def test_round_trip_rebuilds_the_model(tmp_path):
    path = tiny_checkpoint(tmp_path / "a.pt")
    bundle = ckpt.load_bundle(path)
    saved = ckpt.load(path)["model"]
    assert all(torch.equal(v, saved[k]) for k, v in bundle.model.state_dict().items())
    assert bundle.text.tokenizer == "none" and len(bundle.src_vocab) == 20
    assert set(ckpt.load(path)) == {*ckpt.DESCRIPTION, "model"}  # what nmt export keeps is the whole description


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_a_loaded_model_is_the_saved_one_and_is_never_randomly_initialized(tmp_path, monkeypatch, positions):
    path = tiny_checkpoint(tmp_path / "a.pt", positions=positions)
    saved = ckpt.load(path)
    reference = Transformer(ModelConfig.from_dict(saved["model_config"]), 20, 20, PAD_ID, True).eval()
    reference.load_state_dict(saved["model"])
    initialized = []
    xavier = torch.nn.init.xavier_uniform_
    monkeypatch.setattr(torch.nn.init, "xavier_uniform_",
                        lambda t, *args, **kw: initialized.append(t.device.type) or xavier(t, *args, **kw))
    model = ckpt.load_bundle(path).model
    assert initialized and set(initialized) == {"meta"}
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    assert model.src_embed.tokens.weight is model.tgt_embed.tokens.weight  # still one shared matrix
    src, tgt_in = torch.tensor([[5, 6, 7, EOS_ID]]), torch.tensor([[BOS_ID, 8, 9]])
    assert torch.equal(model(src, tgt_in), reference(src, tgt_in))


def test_loading_a_model_does_not_import_the_compiler(tmp_path):
    """PyTorch's meta `normal_` imports torch._dynamo (over a second) on first use: loading skips it."""
    path = tiny_checkpoint(tmp_path / "a.pt")
    code = (f"import sys; from nmt_cli.model.checkpoint import load_bundle; load_bundle({str(path)!r}); "
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


class Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "evil.pt", "wb") as f:
        torch.save({"format_version": 1, "payload": Boom(str(marker))}, f)
    with pytest.raises(NmtError, match="refused to load"):
        ckpt.load(tmp_path / "evil.pt")
    assert not marker.exists()
    # The same object really runs code when unpickled without weights_only (the test can fail).
    with open(tmp_path / "evil.pt", "rb") as f:
        torch.load(f, weights_only=False)
    assert marker.exists()


def test_plain_pickle_is_refused(tmp_path):
    (tmp_path / "p.pt").write_bytes(pickle.dumps({"format_version": 1}))
    with pytest.raises(NmtError, match="p.pt"):
        ckpt.load(tmp_path / "p.pt")


@pytest.mark.parametrize("damage", ["truncate", "random"])
def test_damaged_checkpoint_is_a_clear_error(tmp_path, damage):
    path = tiny_checkpoint(tmp_path / "a.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else bytes(range(256)) * 40)
    with pytest.raises(NmtError, match=r"a.pt: (unreadable or truncated|refused)"):
        ckpt.load(path)


def test_other_format_version_is_refused(tmp_path):
    path = tiny_checkpoint(tmp_path / "a.pt")
    checkpoint = ckpt.load(path)
    checkpoint["format_version"] = 99
    ckpt.save(checkpoint, path)
    with pytest.raises(NmtError, match="format version 99"):
        ckpt.load(path)


def test_average_is_the_exact_mean(tmp_path):
    a, b = tiny_checkpoint(tmp_path / "a.pt", seed=1), tiny_checkpoint(tmp_path / "b.pt", seed=2)
    trained_on = {"directory": "data", "inputs": {"train": ["train.en", "train.de"]}, "pairs": {"train": 9}}
    ckpt.save({**ckpt.load(a), "data": trained_on}, a)
    averaged = average([a, b])
    assert averaged["data"] == trained_on  # for the model card of an export
    ma, mb = ckpt.load(a)["model"], ckpt.load(b)["model"]
    for key, value in averaged["model"].items():
        assert value.dtype == ma[key].dtype
        assert torch.equal(value, ((ma[key].double() + mb[key].double()) / 2).float())
    assert [e["path"] for e in averaged["averaged_from"]] == [str(a), str(b)]
    assert "optimizer" not in averaged and averaged["src_vocab"] == ckpt.load(a)["src_vocab"]
    ckpt.save(averaged, tmp_path / "avg.pt")
    ckpt.load_bundle(tmp_path / "avg.pt")  # usable for translation


def test_average_refuses_other_architectures(tmp_path):
    a = tiny_checkpoint(tmp_path / "a.pt")
    b = tiny_checkpoint(tmp_path / "b.pt", d_ff=128)
    with pytest.raises(NmtError, match=r"a.pt and .*b.pt differ in d_ff \(64 vs 128\)"):
        average([a, b])
    c = tiny_checkpoint(tmp_path / "c.pt", symbols="abcdefghijklmnoq")
    with pytest.raises(NmtError, match="differ in src_vocab"):
        average([a, c])


def test_last_n_by_update_number_not_file_time(tmp_path):
    import os

    for n in (100, 20, 300, 4):
        tiny_checkpoint(tmp_path / f"checkpoint_{n}.pt")
    os.utime(tmp_path / "checkpoint_4.pt", (4e9, 4e9))  # newest file, oldest update
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["checkpoint_100.pt", "checkpoint_300.pt"]
    with pytest.raises(NmtError, match=r"4 numbered checkpoint.*fewer than --last 5; --last 4 averages them$"):
        last_checkpoints(tmp_path, 5)


def test_average_checkpoints_cli(tmp_path):
    for n in (1, 2, 3):
        tiny_checkpoint(tmp_path / f"checkpoint_{n}.pt", seed=n)
    result = CliRunner().invoke(main, ["average-checkpoints", "--dir", str(tmp_path), "--last", "2",
                                       "-o", str(tmp_path / "avg.pt")])
    assert result.exit_code == 0, result.output
    assert [e["updates"] for e in ckpt.load(tmp_path / "avg.pt")["averaged_from"]] == [None, None]
    result = CliRunner().invoke(main, ["average-checkpoints", "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 2
    (tmp_path / "bad.pt").write_bytes(b"garbage")
    result = CliRunner().invoke(main, ["average-checkpoints", "--inputs", str(tmp_path / "checkpoint_1.pt"),
                                       "--inputs", str(tmp_path / "bad.pt"), "-o", str(tmp_path / "y.pt")])
    assert result.exit_code == 1 and "bad.pt" in result.output and not (tmp_path / "y.pt").exists()


def craft(checkpoint: dict, damage: str) -> dict:
    """`checkpoint` with one thing wrong, as an adversary or a broken tool would write it."""
    weights = dict(checkpoint["model"])
    name = "decoder_layers.0.ffn.w1.weight"
    if damage == "shape":
        weights[name] = weights[name][:, :-1].clone()
    elif damage == "missing":
        del weights[name]
    elif damage == "extra":
        weights["backdoor.weight"] = torch.zeros(2)
    elif damage == "int64":
        weights[name] = weights[name].long()
    elif damage == "nan":
        weights[name] = weights[name].clone()
        weights[name][0, 0] = float("nan")
    elif damage == "positions":
        return {**checkpoint, "model_config": {**checkpoint["model_config"], "max_positions": 2**31}}
    elif damage == "vocabulary":
        return {**checkpoint, "tgt_vocab": 42}
    elif damage in ("release search", "release tokens"):  # what `nmt import` keeps of a release
        search, never = ({"beem": 4}, []) if damage == "release search" else ({}, ["zzz"])
        return {**checkpoint, "released": {"search": search, "never_output": never, "origin": None}}
    return {**checkpoint, "model": weights}


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
@pytest.mark.parametrize("damage, message", [
    ("shape", "tensor decoder_layers.0.ffn.w1.weight has shape [64, 31], the config needs [64, 32]"),
    ("missing", "tensor decoder_layers.0.ffn.w1.weight is missing"),
    ("extra", "tensor backdoor.weight is not one of the model's"),
    ("int64", "tensor decoder_layers.0.ffn.w1.weight holds int64 values, not floating point"),
    ("nan", "tensor decoder_layers.0.ffn.w1.weight holds NaN or infinite values"),
    ("positions", "damaged checkpoint: max_positions=2147483648: must be <= 65536"),
    ("vocabulary", "damaged checkpoint: tgt_vocab is not a vocabulary"),
    ("release search", "damaged checkpoint: SearchConfig.__init__() got an unexpected keyword argument 'beem'"),
    ("release tokens", "damaged checkpoint: released.never_output names 'zzz', which the target vocabulary lacks"),
])
def test_a_crafted_checkpoint_is_refused_on_load_naming_what_is_wrong(tmp_path, fmt, damage, message):
    good = ckpt.load(tiny_checkpoint(tmp_path / "m.pt"))
    path = tmp_path / f"crafted.{fmt}"
    (ckpt.save if fmt == "pt" else ckpt.save_safetensors)(craft(good, damage), path)
    for read in (ckpt.load, ckpt.load_bundle):
        with pytest.raises(NmtError) as refused:
            read(path)
        assert str(refused.value) == f"{path}: {message}" or str(refused.value).startswith(f"{path}: {message}")
    result = CliRunner().invoke(main, ["translate", "-m", str(path), "--device", "cpu"], input="a b\n")
    assert result.exit_code == 1 and result.output.strip().splitlines() == [f"Error: {refused.value}"]


def test_a_checkpoint_averages_with_its_safetensors_export(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    assert CliRunner().invoke(main, ["export", "-m", str(model), "--format", "safetensors", "-o",
                                     str(tmp_path / "m.safetensors")]).exit_code == 0
    averaged = average([model, tmp_path / "m.safetensors"])
    assert all(torch.equal(averaged["model"][k], v) for k, v in ckpt.load(model)["model"].items())


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_checkpoint_of_format_version_1_loads_and_translates_as_it_did(tmp_path):
    """tests/model/fixtures/v1_model.pt was written by nmt-cli at 32915c5 (format version 1, before the
    pre-softmax projection had a name of its own): it is migrated on load, and a model saved again
    is format version 2 with the same weights and translations."""
    old = ckpt.load(FIXTURES / "v1_model.pt")
    assert old["format_version"] == ckpt.FORMAT_VERSION == 2
    assert old["model"]["output_projection.weight"] is old["model"]["tgt_embed.tokens.weight"]
    model = ckpt.load_bundle(FIXTURES / "v1_model.pt").model
    assert model.output_projection.weight is model.tgt_embed.tokens.weight  # still tied
    ckpt.save(ckpt.load_bundle(FIXTURES / "v1_model.pt").describe(), tmp_path / "v2.pt")
    assert torch.load(tmp_path / "v2.pt", weights_only=True)["format_version"] == 2
    paths = (FIXTURES / "v1_model.pt", tmp_path / "v2.pt")
    outputs = [CliRunner().invoke(main, ["translate", "-m", str(path), "--device", "cpu"],
                                  input="a b c\np o n\n").output for path in paths]
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 2


def test_a_directory_given_as_a_checkpoint_names_the_one_to_pass(tmp_path):
    """`-m DIR` (or Translator.load(DIR)) with a save directory names its checkpoint_best.pt; a
    data directory and any other directory are said to be what they are."""
    from click.testing import CliRunner

    save_dir, data_dir, other = tmp_path / "ck", tmp_path / "data", tmp_path / "other"
    for directory in (save_dir, data_dir, other):
        directory.mkdir()
    tiny_checkpoint(save_dir / "checkpoint_best.pt")
    (data_dir / "meta.json").write_text("{}")
    expected = {save_dir: f"{save_dir}: a save directory, not a checkpoint: pass {save_dir / 'checkpoint_best.pt'}, "
                          f"or an average (nmt average-checkpoints --dir {save_dir} -o avg.pt)",
                data_dir: f"{data_dir}: a data directory (nmt preprocess's), not a checkpoint: pass a checkpoint "
                          "that nmt train wrote",
                other: f"{other}: a directory, not a checkpoint file",
                tmp_path / "none.pt": f"{tmp_path / 'none.pt'}: no such checkpoint"}
    for path, message in expected.items():
        with pytest.raises(NmtError) as refused:
            ckpt.load(path)
        assert str(refused.value) == message
    result = CliRunner().invoke(main, ["translate", "-m", str(save_dir)], input="a\n")
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == f"Error: {expected[save_dir]}"
