"""Released models: a `Release` as `nmt import` reads it (each format's reader, formats.py's
table), the one neutral description between the formats and our checkpoint, before importer.py
makes it ours: its architecture, its weights under our names but in its own layouts, its
vocabularies with the ids of their special roles, its text pipeline and decoding settings; with
the text settings of Marian's and the peers' releases, fairseq's names of a layer's weights, and
Marian's layout of the sinusoid. (The reading the formats share is reading.py's.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.model.architecture import ModelConfig


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
