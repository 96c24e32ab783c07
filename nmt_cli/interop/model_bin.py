"""CTranslate2's `model.bin`, read without CTranslate2 (which converts into it, never out of it):
the spec's name and revision, each variable's name, shape, type and bytes, and the aliases (a
variable stored once under several names), in the binary versions CTranslate2 has written (2 to
6; 4.x writes 6). Every count and size is checked against what is left of the file before
anything is allocated, so a cut or hostile file is refused in one line; nothing in it is run.

Quantized weights come back as CTranslate2 computes with them: an int8 or int16 `weight` with its
`weight_scale` (q = round(w x scale), per row for int8, one for int16) is q / scale in float32;
float16 and bfloat16 are widened to float32 exactly."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor

from nmt_cli.errors import NmtError
from nmt_cli.files import note_read

# CTranslate2's DataType ids (include/ctranslate2/types.h), and the item size of the versions before
# 4, which stored a width where a type id is now.
DTYPES = (torch.float32, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16)
BY_WIDTH = {4: torch.float32, 2: torch.int16, 1: torch.int8}
VERSIONS = range(2, 7)
INT16_SCALE = 1000.0  # CTranslate2's global int16 scale, for int16 models saved without one
MAX_RANK = 8


@dataclass
class ModelBin:
    """The variables of a model.bin by name, aliases resolved, quantized ones dequantized."""

    spec: str
    revision: int
    variables: dict[str, Tensor]
    aliases: dict[str, str]  # an alias -> the name it stands for
    quantization: str  # the stored type of the weights: float32, float16, bfloat16, int8 or int16

    def get(self, name: str) -> Tensor | None:
        return self.variables.get(self.aliases.get(name, name))

    def same(self, a: str, b: str) -> bool:
        """Whether two names are one stored variable (an alias of the other, or equal values)."""
        x, y = self.get(a), self.get(b)
        if x is None or y is None:
            return False
        return self.aliases.get(a, a) == self.aliases.get(b, b) or (x.shape == y.shape and torch.equal(x, y))


class _Reader:
    """Reads a model.bin's fields, each checked against the bytes left."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.left, self.path = f, size, path

    def bytes(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise NmtError(f"{self.path}: cut short or damaged: {what} of {n:,} bytes, {self.left:,} left in the file")
        self.left -= n
        return self.f.read(n)

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.bytes(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.bytes(self.number("H", what), what)
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise NmtError(f"{self.path}: damaged: {what} is not UTF-8") from None

    def tensor(self, name: str, version: int) -> Tensor:
        rank = self.number("B", f"the rank of {name}")
        if rank > MAX_RANK:
            raise NmtError(f"{self.path}: damaged: variable {name} of rank {rank}")
        shape = [self.number("I", f"the shape of {name}") for _ in range(rank)]
        if version >= 4:
            type_id = self.number("B", f"the type of {name}")
            if type_id >= len(DTYPES):
                raise NmtError(f"{self.path}: variable {name} of an unknown type ({type_id})")
            dtype, size = DTYPES[type_id], self.number("I", f"the size of {name}")
        else:
            width = self.number("B", f"the width of {name}")
            if width not in BY_WIDTH:
                raise NmtError(f"{self.path}: variable {name} of an unknown width ({width})")
            dtype, size = BY_WIDTH[width], self.number("I", f"the size of {name}") * width
        count = 1
        for n in shape:
            count *= n
        if size != count * dtype.itemsize:
            raise NmtError(f"{self.path}: damaged: variable {name} of shape {shape} holds {size:,} bytes")
        data = bytearray(self.bytes(size, f"variable {name}"))  # checked against the file before allocation
        return torch.frombuffer(data, dtype=dtype).reshape(shape) if size else torch.empty(shape, dtype=dtype)


def read_model_bin(path: Path) -> ModelBin:
    """The variables of `path`, or a one-line error naming the file and what is wrong."""
    note_read(path)
    try:
        with open(path, "rb") as f:
            reader = _Reader(f, os.fstat(f.fileno()).st_size, path)
            version = reader.number("I", "the binary version")
            if version not in VERSIONS:
                raise NmtError(f"{path}: binary version {version}; nmt import reads CTranslate2's versions "
                               f"{VERSIONS.start} to {VERSIONS.stop - 1}")
            spec, revision = reader.string("the spec's name"), reader.number("I", "the spec's revision")
            stored = {}
            for _ in range(reader.number("I", "the number of variables")):
                name = reader.string("a variable's name")
                stored[name] = reader.tensor(name, version)
            aliases = {}
            if version >= 3:
                for _ in range(reader.number("I", "the number of aliases")):
                    alias = reader.string("an alias")
                    aliases[alias] = reader.string(f"the variable alias {alias} names")
    except OSError as e:
        raise NmtError(f"{path}: unreadable ({e.strerror or e})") from None
    missing = sorted(alias for alias, name in aliases.items() if name not in stored)
    if missing:
        raise NmtError(f"{path}: damaged: alias {missing[0]} names a variable it does not hold")
    return ModelBin(spec, revision, dequantized(stored, path), aliases, weight_type(stored))


def weight_type(stored: dict[str, Tensor]) -> str:
    """The type the model's weights were saved in (CTranslate2's quantization)."""
    types = {str(t.dtype).removeprefix("torch.") for name, t in stored.items() if name.endswith("weight")}
    return next((kind for kind in ("int8", "int16", "float16", "bfloat16") if kind in types), "float32")


def dequantized(stored: dict[str, Tensor], path: Path) -> dict[str, Tensor]:
    """Every variable as CTranslate2 computes with it: quantized weights divided by their scales,
    16-bit floats widened; the scales themselves dropped."""
    out = {}
    for name, tensor in stored.items():
        if name.endswith("_scale") and name.removesuffix("_scale") in stored:
            continue
        if tensor.dtype in (torch.int8, torch.int16) and name.endswith("weight"):
            scale = stored.get(name + "_scale")
            if scale is None and tensor.dtype == torch.int8:
                raise NmtError(f"{path}: int8 variable {name} without its {name}_scale")
            scale = torch.tensor(INT16_SCALE) if scale is None else scale.float()
            rows = scale.reshape(-1, *([1] * (tensor.dim() - 1))) if scale.numel() > 1 else scale.reshape(())
            if scale.numel() not in (1, tensor.size(0) if tensor.dim() else 1):
                raise NmtError(f"{path}: {name}_scale has {scale.numel()} values for {tensor.size(0)} rows")
            out[name] = tensor.float() / rows
        elif tensor.dtype in (torch.float16, torch.bfloat16):
            out[name] = tensor.float()
        else:
            out[name] = tensor
    return out
