"""Released models: a `Release` as `nmt import` reads it (import_transformers.py,
import_marian.py, import_fairseq.py, import_onmt.py), before importer.py makes it ours (its
architecture, its weights under our names but in its own layouts, its vocabularies with the ids of
their special roles, its text pipeline and decoding settings), the reading the formats share
(bounded files, BPE codes, SentencePiece models, checkpoints without running pickled code), and
Marian's layout of the sinusoid."""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import small_file
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.text.pieces import load_sentencepiece
from nmt_cli.text.processor import check_codes


def check_rows(weights: dict[str, Tensor], shared: bool, sides: tuple[list[str], list[str]],
               where: tuple[str, str]) -> None:
    """Each side's vocabulary as long as its embedding (a vocabulary of another model would put
    tokens on rows not theirs): one line naming `where` that side's vocabulary comes from."""
    names = ("tgt_embed" if shared else "src_embed", "tgt_embed")
    for name, tokens, place in zip(names, sides, where):
        rows = weights[f"{name}.tokens.weight"].size(0)
        if rows != len(tokens):
            raise NmtError(f"{place}: {len(tokens):,} tokens, where the checkpoint's embedding has {rows:,} rows: "
                           "not this checkpoint's vocabulary")


def sines_then_cosines(d_model: int) -> torch.Tensor:
    """Marian's dimension i is our dimension order[i]: our sin/cos pairs, sines first."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


@dataclass
class Side:
    """One side's vocabulary as released: tokens by id, and the ids of its special roles."""

    tokens: list[str]
    pad: int  # the row our <pad> takes
    start: int  # the row the decoder starts from (our <s>)
    eos: int
    unk: int

    def rows(self) -> tuple[list[int], list[str]]:
        """The released row of each of our ids, and our tokens after the specials: a token named
        as one of our specials but none of the release's roles (tc-big's `<s>`) stays an ordinary
        one, its row and its text kept."""
        roles = [self.pad, self.start, self.eos, self.unk]
        taken = set(roles)
        rest = [i for i in range(len(self.tokens)) if i not in taken]
        return roles + rest, [self.tokens[i] for i in rest]


@dataclass
class Release:
    """A released model as read from its files, before it becomes ours: weights under our names in
    its own layout (rows in its token ids; its residual stream's dimensions in the order whose
    argsort is `order`: Marian's sines first, see `sines_then_cosines`; None: ours), its text
    pipeline (settings, BPE codes or SentencePiece models), its search settings."""

    config: ModelConfig
    weights: dict[str, Tensor]
    source: Side
    target: Side
    shared: bool
    text: TextConfig
    source_spm: bytes | None = None
    target_spm: bytes | None = None
    bpe_codes: str | None = None
    search: dict[str, Any] = field(default_factory=dict)
    never_output: list[str] = field(default_factory=list)
    origin: str = ""
    order: Tensor | None = None


FILE_BYTES = 64 << 20  # a release's configurations, vocabularies and SentencePiece models: a few MB at most


def marian_text(langs: tuple[str, str]) -> TextConfig:
    """The text settings of a Marian release: SentencePiece, a line's leading >>code<< kept."""
    return TextConfig(source_lang=langs[0], target_lang=langs[1], subword="sentencepiece", language_codes=True)


def peer_text(langs: tuple[str, str], tokenizer: str | None, pieces: bool, peer: str,
              fairseq_moses: bool = False) -> TextConfig:
    """The text settings of a `peer` toolkit's model (fairseq, OpenNMT-py): with SentencePiece
    (`pieces`), the raw line, as both give it (another --tokenizer than none is refused); else
    `tokenizer` (none by default) then BPE, without Moses' punctuation normalization or tag
    protection, which neither has. `fairseq_moses`: fairseq's `--tokenizer moses`, which splits
    dashes and escapes XML characters."""
    if pieces:
        if tokenizer not in (None, "none"):
            raise NmtError(f"--tokenizer {tokenizer} with --sentencepiece: {peer}'s SentencePiece text is the raw "
                           "line (--tokenizer none)")
        return TextConfig(source_lang=langs[0], target_lang=langs[1], subword="sentencepiece")
    moses = fairseq_moses and tokenizer == "moses"
    return TextConfig(source_lang=langs[0], target_lang=langs[1], subword="bpe", tokenizer=tokenizer or "none",
                      normalize_punctuation=False, aggressive_dash_splits=moses, escape=moses, protect_tags=False)


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


def layer_weights(take: Callable[[str], Tensor], side: str, i: int) -> dict[str, Tensor]:
    """Layer `i` of the encoder or decoder under our names, from fairseq's names (which
    MarianMTModel keeps): Q, K and V of self-attention fused as ours are, K and V of
    encoder-decoder attention, the FFN, and a norm per sublayer; `take` reads a tensor by name."""
    ours, theirs = f"{side}_layers.{i}.", f"{side}.layers.{i}."
    attentions = [("self_attn", "self_attn")] + ([("cross_attn", "encoder_attn")] if side == "decoder" else [])
    norms = ["self_attn_layer_norm"] + (["encoder_attn_layer_norm"] if side == "decoder" else [])
    weights: dict[str, Tensor] = {}
    for n, ((mine, name), norm) in enumerate(zip(attentions, norms)):
        q, k, v, o = (f"{theirs}{name}.{p}_proj." for p in ("q", "k", "v", "out"))
        fused = ("qkv", (q, k, v)) if mine == "self_attn" else ("kv", (k, v))
        for kind in ("weight", "bias"):
            weights[f"{ours}{mine}.{fused[0]}.{kind}"] = torch.cat([take(p + kind) for p in fused[1]])
            weights[f"{ours}{mine}.out.{kind}"] = take(o + kind)
            weights[f"{ours}sublayers.{n}.norm.{kind}"] = take(f"{theirs}{norm}.{kind}")
            if mine == "cross_attn":
                weights[f"{ours}{mine}.q.{kind}"] = take(q + kind)
    last = len(attentions)
    for kind in ("weight", "bias"):
        weights[f"{ours}ffn.w1.{kind}"] = take(f"{theirs}fc1.{kind}")
        weights[f"{ours}ffn.w2.{kind}"] = take(f"{theirs}fc2.{kind}")
        weights[f"{ours}sublayers.{last}.norm.{kind}"] = take(f"{theirs}final_layer_norm.{kind}")
    return weights


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


def plain(value: Any) -> Any:
    """`value` with omegaconf's containers (stand-ins) made dictionaries and lists of their values."""
    if isinstance(value, OmegaconfObject):
        state = value.state if isinstance(value.state, dict) else {}
        content = state.get("_content", state.get("_val"))
        return plain(content)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def load_pickled(path: Path) -> dict[str, Any]:
    """A checkpoint file's dictionary (fairseq's, OpenNMT-py's), read with torch's weights-only
    unpickler and argparse.Namespace and omegaconf's containers of plain values allowed besides (as
    stand-ins, made plain: `plain`): a class of anything else is refused, naming it, and no code
    runs."""
    allowed = [argparse.Namespace, dict, list, int, typing.Any, collections.defaultdict, *OMEGACONF_STAND_INS]
    try:
        with torch.serialization.safe_globals(allowed):
            state = plain(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 (torch's safe unpickler fails on other files in many ways)
        if found := re.search(r"Unsupported global: GLOBAL (\S+)", str(e)):
            raise NmtError(f"{path}: refused: it holds {found.group(1)}, which no fairseq or OpenNMT-py "
                           "checkpoint's weights or options are (nothing in it was run)") from None
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise NmtError(f"{path}: unreadable ({detail[:200]})") from None
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
    with open(path, "rb") as f:
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
