"""CTranslate2's model.bin as model_bin.py reads it: what CTranslate2's own writer stores (every
type it quantizes to) comes back as CTranslate2 computes with it, q / scale for int8 and int16
(the scales computed here by the rule of CTranslate2's converter), 16-bit floats widened; a cut,
damaged or hostile file is one line naming the file, before anything large is allocated."""

import struct

import numpy as np
import pytest
import torch
from conftest import NEEDS_CTRANSLATE2, tiny_checkpoint

from nmt_cli.errors import NmtError
from nmt_cli.interop.model_bin import read_model_bin
from nmt_cli.model.checkpoint import load_bundle


def exported(tmp_path, quantization):
    from nmt_cli.interop.export_ctranslate2 import save_ctranslate2

    bundle = load_bundle(tiny_checkpoint(tmp_path / "m.pt", seed=3, tied_output=False))
    save_ctranslate2(bundle, tmp_path / "ct2", quantization)
    return bundle, read_model_bin(tmp_path / "ct2" / "model.bin")


def int8(w):
    """CTranslate2's int8 rule (specs/model_spec.py): a scale per row, 127 / its largest magnitude."""
    w = w.double().numpy().astype(np.float32)
    scale = np.float32(127.0) / np.maximum(np.abs(w).max(axis=1), np.float32(127) / np.finfo(np.float32).max)
    return torch.from_numpy(np.rint(w * scale[:, None]).astype(np.int8).astype(np.float32) / scale[:, None])


def int16(w):
    """CTranslate2's int16 rule: one scale, 2^10 over the largest magnitude."""
    w = w.numpy().astype(np.float32)
    scale = np.float32(2**10 / np.amax(np.absolute(w)))
    return torch.from_numpy(np.clip(np.rint(w * scale), -32768, 32767).astype(np.int16).astype(np.float32) / scale)


@NEEDS_CTRANSLATE2
@pytest.mark.parametrize("quantization, expected", [
    ("float32", lambda w: w), ("float16", lambda w: w.half().float()), ("bfloat16", lambda w: w.bfloat16().float()),
    ("int8", int8), ("int16", int16)])
def test_each_stored_type_comes_back_as_ctranslate2_computes_with_it(tmp_path, quantization, expected):
    bundle, model = exported(tmp_path, quantization)
    assert model.spec == "TransformerSpec" and model.quantization == quantization
    weight = bundle.model.encoder_layers[0].ffn.w1.weight.detach()
    assert torch.equal(model.get("encoder/layer_0/ffn/linear_0/weight"), expected(weight))
    projection = bundle.model.output_projection.weight.detach()
    assert torch.equal(model.get("decoder/projection/weight"), expected(projection))
    assert not any(name.endswith("_scale") for name in model.variables)  # used, then dropped


@NEEDS_CTRANSLATE2
def test_an_int8_export_leaves_the_models_weights_as_they_were(tmp_path):
    bundle, _ = exported(tmp_path, "int8")
    saved = load_bundle(tmp_path / "m.pt").model
    assert torch.equal(bundle.model.encoder_layers[0].ffn.w1.weight, saved.encoder_layers[0].ffn.w1.weight)


@NEEDS_CTRANSLATE2
def test_aliases_are_one_variable(tmp_path):
    _, model = exported(tmp_path, "int8")
    assert model.aliases["encoder/embeddings_0/weight"] == "decoder/embeddings/weight"  # shared, stored once
    assert model.same("encoder/embeddings_0/weight", "decoder/embeddings/weight")
    assert not model.same("decoder/projection/weight", "decoder/embeddings/weight")  # untied


@NEEDS_CTRANSLATE2
def test_a_cut_or_damaged_file_is_one_line(tmp_path):
    exported(tmp_path, "float32")
    data = (tmp_path / "ct2" / "model.bin").read_bytes()
    for cut in (3, 40, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.bin").write_bytes(data[:cut])
        with pytest.raises(NmtError, match=r"cut\.bin: cut short or damaged"):
            read_model_bin(tmp_path / "cut.bin")
    (tmp_path / "v9.bin").write_bytes(struct.pack("<I", 9) + data[4:])
    with pytest.raises(NmtError, match="binary version 9"):
        read_model_bin(tmp_path / "v9.bin")


@NEEDS_CTRANSLATE2
def test_a_weight_without_its_scale_or_an_alias_without_its_variable_is_one_line(tmp_path):
    exported(tmp_path, "int8")
    data = (tmp_path / "ct2" / "model.bin").read_bytes()
    (tmp_path / "scale.bin").write_bytes(data.replace(b"decoder/projection/weight_scale",
                                                      b"decoder/projection/weight_scalX"))
    with pytest.raises(NmtError, match="int8 variable decoder/projection/weight without its "
                                       "decoder/projection/weight_scale"):
        read_model_bin(tmp_path / "scale.bin")
    last = data.rindex(b"decoder/embeddings/weight")  # in the aliases: what encoder/embeddings_0 stands for
    (tmp_path / "alias.bin").write_bytes(data[:last] + b"decoder/embeddings/weighX" + data[last + 25:])
    with pytest.raises(NmtError, match="damaged: alias encoder/embeddings_0/weight names a variable it does not hold"):
        read_model_bin(tmp_path / "alias.bin")


def hostile(tmp_path, dims, size, dtype=0):
    """A model.bin naming one variable of `dims` and `size` bytes, with none of them present."""
    def string(s):
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    body = struct.pack("<I", 6) + string("TransformerSpec") + struct.pack("<II", 7, 1) + string("w")
    body += struct.pack("<B", len(dims)) + b"".join(struct.pack("<I", d) for d in dims)
    body += struct.pack("<BI", dtype, size)
    (tmp_path / "h.bin").write_bytes(body)
    return tmp_path / "h.bin"


def test_sizes_are_checked_before_anything_is_allocated(tmp_path):
    with pytest.raises(NmtError, match="variable w of 4,294,967,292 bytes, 0 left"):  # 4 GB claimed, none there
        read_model_bin(hostile(tmp_path, [(1 << 30) - 1], (1 << 32) - 4))
    with pytest.raises(NmtError, match="shape .* holds 4 bytes"):  # a shape of 2^40 elements over 4 bytes
        read_model_bin(hostile(tmp_path, [1 << 20, 1 << 20], 4))
    with pytest.raises(NmtError, match="unknown type"):
        read_model_bin(hostile(tmp_path, [1], 4, dtype=9))
