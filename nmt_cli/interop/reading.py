"""The reading that `nmt import`'s formats share, none of it running code from a file: files of
bounded size (a release's JSON, text and SentencePiece models), vocabularies by id, released
settings checked one by one, checkpoints unpickled with nothing but plain values allowed, and
safetensors files read tensor by tensor, each size checked before anything is allocated."""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import stat
import typing
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.errors import NmtError
from nmt_cli.files import note_read, small_file
from nmt_cli.text.pieces import load_sentencepiece
from nmt_cli.text.processor import check_codes

FILE_BYTES = 64 << 20  # a release's configurations, vocabularies and SentencePiece models: a few MB at most

def read_json(path: Path) -> Any:
    if not path.exists():
        raise NmtError(f"{path}: missing (a released model needs it)")
    try:
        return json.loads(small_file(path, "a release's JSON file", FILE_BYTES))
    except ValueError as e:
        raise NmtError(f"{path}: unreadable ({e})") from None
    except RecursionError:
        raise NmtError(f"{path}: JSON nested too deeply to be a release's file") from None


KINDS = {bool: "true or false", int: "an integer", float: "a number"}


def setting(settings: dict[str, Any], key: str, kind: type, default: Any, where: Path, low: float | None = None) -> Any:
    """A released search setting `key`: a `kind` (an int where an int goes, never a bool, a string
    or 4.5) not below `low`; absent or null: `default`. Refused in one line naming `where`."""
    value = settings.get(key)
    if value is None:
        return default
    fits = isinstance(value, bool) if kind is bool else not isinstance(value, bool) and \
        isinstance(value, int if kind is int else (int, float))
    if not fits or (kind is not bool and (not math.isfinite(value) or low is not None and value < low)):
        bound = f" of at least {low:g}" if low is not None and kind is not bool else ""
        raise NmtError(f"{where}: {key} {value!r}: expected {KINDS[kind]}{bound}")
    return value


def tokens_by_id(mapping: dict[str, int], path: Path) -> list[str]:
    """The tokens of a vocabulary file's {token: id} by id: every id from 0 up, once."""
    tokens = {i: t for t, i in mapping.items()}
    if sorted(tokens) != list(range(len(mapping))):
        raise NmtError(f"{path}: its ids are not 0 to {len(mapping) - 1}, each once")
    return [tokens[i] for i in range(len(tokens))]


def token_id(tokens: list[str], name: str, source: Path) -> int:
    try:
        return tokens.index(name)
    except ValueError:
        raise NmtError(f"{source}: the vocabulary has no {name!r}") from None


def text_file(path: Path, what: str) -> str:
    """A release's text file (a dictionary, BPE codes): a regular UTF-8 file of at most FILE_BYTES."""
    try:
        return small_file(path, what, FILE_BYTES).decode("utf-8")
    except UnicodeDecodeError as e:
        raise NmtError(f"{path}: {what} not UTF-8 (byte {e.start})") from None


def read_codes(path: Path) -> str:
    """subword-nmt BPE codes of a checkpoint's text, checked as the text pipeline reads them."""
    return check_codes(text_file(path, "BPE codes"), str(path))


def sentencepiece_file(path: Path) -> bytes:
    if not path.exists():
        raise NmtError(f"{path}: missing (a released model needs it)")
    data = small_file(path, "a SentencePiece model", FILE_BYTES)
    load_sentencepiece(data, str(path), specials=False)
    return data


class OmegaconfObject:
    """A stand-in for one of omegaconf's containers or nodes (a fairseq checkpoint's options may be
    pickled so): its pickled state kept as it is, no omegaconf imported, nothing run."""

    def __init__(self, *args: Any) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


# omegaconf's classes that a pickled configuration of plain values holds, by where they live.
OMEGACONF = {"omegaconf.dictconfig": ["DictConfig"], "omegaconf.listconfig": ["ListConfig"],
             "omegaconf.base": ["ContainerMetadata", "Metadata"],
             "omegaconf.nodes": ["AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode"]}
OMEGACONF_STAND_INS = [type(name, (OmegaconfObject,), {"__module__": module, "__qualname__": name})
                       for module, names in OMEGACONF.items() for name in names]


def plain(value: Any, done: dict[int, Any] | None = None, open_: set[int] | None = None) -> Any:
    """`value` with omegaconf's containers (stand-ins) made dictionaries and lists of their values,
    each object made once however often it is shared (one list shared 40 levels deep is 40 lists,
    not 2^40: `done`); an object inside itself (`open_`: those being made) and a tensor with more
    elements than its storage holds (stride 0: billions of elements over one) are refused, with a
    ValueError, before anything is copied."""
    done, open_ = ({} if done is None else done), (set() if open_ is None else open_)
    if isinstance(value, Tensor):
        check_storage(value)
        return value
    if not isinstance(value, (OmegaconfObject, dict, list)):
        return value
    if id(value) in open_:
        raise ValueError("an object that holds itself")
    if id(value) not in done:
        open_.add(id(value))
        if isinstance(value, OmegaconfObject):
            state = value.state if isinstance(value.state, dict) else {}
            done[id(value)] = plain(state.get("_content", state.get("_val")), done, open_)
        elif isinstance(value, dict):
            done[id(value)] = {key: plain(item, done, open_) for key, item in value.items()}
        else:
            done[id(value)] = [plain(item, done, open_) for item in value]
        open_.discard(id(value))
    return done[id(value)]


def check_storage(tensor: Tensor) -> None:
    """Refuse a tensor whose elements need more bytes than its storage holds: a view that repeats
    its storage (stride 0, or overlapping strides), which any copy would make that large."""
    needed, held = tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes()
    if needed > held:
        raise ValueError(f"a tensor of shape {tuple(tensor.shape)} over a storage of {held:,} bytes (it repeats "
                         "its storage; no checkpoint's weight does)")


def unpickling_error(path: Path, error: Exception, what: str) -> NmtError:
    """What torch's weights-only unpickler refused in `path`, in one line: the global it holds,
    which none of `what` is, and that nothing in it ran (not torch's advice to load it unsafely);
    or the first line of what made it unreadable."""
    if found := re.search(r"Unsupported global: GLOBAL (\S+)", str(error)):
        return NmtError(f"{path}: refused: it holds {found.group(1)}, not {what} (nothing in it was run)")
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return NmtError(f"{path}: unreadable ({detail[:200]})")


def load_pickled(path: Path) -> dict[str, Any]:
    """A checkpoint file's dictionary (fairseq's, OpenNMT-py's), read with torch's weights-only
    unpickler and argparse.Namespace and omegaconf's containers of plain values allowed besides (as
    stand-ins, made plain: `plain`): a class of anything else is refused, naming it, and no code
    runs."""
    allowed = [argparse.Namespace, dict, list, int, typing.Any, collections.defaultdict, *OMEGACONF_STAND_INS]
    note_read(path)
    try:
        with torch.serialization.safe_globals(allowed):
            state = plain(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 (torch's safe unpickler fails on other files in many ways)
        raise unpickling_error(path, e, "a fairseq or OpenNMT-py checkpoint's weights or options") from None
    if not isinstance(state, dict):
        raise NmtError(f"{path}: not a checkpoint (no dictionary of weights and options)")
    return state


HEADER_BYTES = 100 << 20  # a safetensors header lists tensors: its format caps it at 100 MB
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file (a little-endian header size, a JSON header of dtypes,
    shapes and offsets, the data), each read into a tensor of its own: a memory-mapped file would
    stay resident whole, the model twice over while it is converted."""
    note_read(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NmtError(f"{path}: not a regular file (weights in safetensors are one)")
    with os.fdopen(fd, "rb") as f:
        data = os.fstat(f.fileno()).st_size - 8  # the header, then the tensors' bytes
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= min(data, HEADER_BYTES):
            raise ValueError(f"a header of {size:,} bytes in a file of {data + 8:,}")
        header = json.loads(f.read(size))
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype, shape = SAFETENSORS_DTYPES[entry["dtype"]], [int(n) for n in entry["shape"]]
            begin, end = (int(n) for n in entry["data_offsets"])
            needed = math.prod(shape) * dtype.itemsize  # checked before anything is allocated
            if min(shape, default=0) < 0 or end - begin != needed or not 0 <= begin <= end <= data - size:
                raise ValueError(f"tensor {name}: bytes {begin} to {end} listed, {needed:,} needed, "
                                 f"{data - size:,} in the file")
            tensor = torch.empty(shape, dtype=dtype)
            f.seek(8 + size + begin)
            if f.readinto(memoryview(tensor.view(-1).view(torch.uint8).numpy())) != needed:
                raise ValueError(f"tensor {name}: fewer than its {needed:,} bytes read")
            tensors[name] = tensor
    return tensors


def safetensors_file(path: Path) -> dict[str, Tensor]:
    """`read_safetensors`, or a one-line error naming the file."""
    try:
        return read_safetensors(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as e:
        raise NmtError(f"{path}: unreadable or truncated ({str(e).splitlines()[0][:200]})") from None
