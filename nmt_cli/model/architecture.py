"""The architecture of §3: every knob of Table 3 as a field (`ModelConfig`, saved in every
checkpoint), the paper's presets, the analytic parameter count, and Table 3's rows with the
counts the paper reports, so that `nmt info` can name the row an architecture is."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nmt_cli.options import Options, knob

POSITIONS = ("sinusoidal", "learned")
NORMS = ("post", "pre")
# The FFN's nonlinearity: the paper's ReLU (eq. 2), or those of released models (`nmt import`): GELU
# (Hendrycks and Gimpel, 2016) exact or in its tanh or sigmoid approximation (Marian's), swish (x sigmoid(x)).
DECODER_STARTS = ("bos", "eos")
ACTIVATIONS = ("relu", "gelu", "gelu-tanh", "gelu-sigmoid", "swish")
POSITION_TABLE_MAX = 1 << 28  # max_positions x d_model: 1 GiB of float32 positional encodings


@dataclass(frozen=True)
class ModelConfig(Options):
    """The architecture of §3 and every knob of Table 3. Defaults are the paper's base model."""

    encoder_layers: int = knob(6, "Encoder layers N (§3.1).", min=1, max=256)
    decoder_layers: int = knob(6, "Decoder layers N (§3.1).", min=1, max=256)
    d_model: int = knob(512, "Model dimension d_model.", min=1, max=65536)
    d_ff: int = knob(2048, "Inner dimension of the feed-forward network (eq. 2).", min=1,
                     max=1 << 20)
    heads: int = knob(8, "Attention heads h (§3.2.2).", min=1, max=1024)
    d_k: int | None = knob(None, "Query/key dimension per head [default: d_model / heads].", min=1,
                            max=65536)
    d_v: int | None = knob(None, "Value dimension per head [default: d_model / heads].", min=1,
                            max=65536)
    dropout: float = knob(0.1, "Residual and embedding dropout P_drop (§5.4).", min=0.0, max=1.0,
                           exclusive_max=True)
    attention_dropout: float = knob(0.0, "Dropout on attention weights.", min=0.0, max=1.0, exclusive_max=True)
    relu_dropout: float = knob(0.0, "Dropout after the FFN's ReLU.", min=0.0, max=1.0, exclusive_max=True)
    label_smoothing: float = knob(0.1, "Label smoothing eps_ls (§5.4).", min=0.0, max=1.0,
                                   exclusive_max=True)
    positions: str = knob("sinusoidal", "Positional encoding (§3.5; Table 3 row E).", choices=POSITIONS)
    norm: str = knob("post", "Sub-layer norm: post = LayerNorm(x + Sublayer(x)) as in the paper.", choices=NORMS)
    max_positions: int = knob(1024, "Longest sequence (tokens, incl. EOS) the model accepts.", min=1,
                               max=65536)
    activation: str = knob("relu", "The feed-forward network's nonlinearity (eq. 2: ReLU).", choices=ACTIVATIONS)
    scale_embeddings: bool = knob(True, "Multiply token embeddings by sqrt(d_model) (§3.4).",
                                  negation="--no-scale-embeddings")
    tied_output: bool = knob(True, "The pre-softmax projection shares the target embedding's matrix (§3.4).",
                             negation="--untied-output")
    output_bias: bool = knob(False, "A bias on the pre-softmax projection (released Marian models have one).")
    norm_eps: float = knob(1e-5, "The layer norms' epsilon (OpenNMT-py's models: 1e-6).", min=0.0, max=1.0)
    source_eos: bool = knob(True, "A source ends with </s> (OpenNMT-py's models read sources without).",
                            negation="--no-source-eos")
    embedding_norm: bool = knob(False, "A layer norm on the embeddings after the positions are added (not the "
                                "paper's: BART's and mBART's, fairseq's --layernorm-embedding; `nmt import` keeps it).")
    decoder_start: str = knob("bos", "The row a target starts from: <s>'s (bos), or </s>'s (eos, as fairseq's models "
                              "do).", choices=DECODER_STARTS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_positions * self.d_model > POSITION_TABLE_MAX:
            raise ValueError(f"max_positions={self.max_positions} x d_model={self.d_model}: a table of positions "
                             f"larger than {POSITION_TABLE_MAX:,} entries")
        if self.d_k is None or self.d_v is None:
            if self.d_model % self.heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by heads={self.heads}: set d_k and d_v"
                )
            object.__setattr__(self, "d_k", self.d_k or self.d_model // self.heads)
            object.__setattr__(self, "d_v", self.d_v or self.d_model // self.heads)

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with the given fields changed (None values are ignored)."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if "heads" in overrides or "d_model" in overrides:
            # d_k/d_v follow d_model/heads unless they are given explicitly.
            overrides.setdefault("d_k", None)
            overrides.setdefault("d_v", None)
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config field(s): {', '.join(sorted(unknown))}")
        return cls(**d)

    def num_parameters(self, src_vocab: int, tgt_vocab: int, shared_vocab: bool) -> int:
        """The analytic parameter count of the model `model.Transformer` builds.

        Embeddings: one V x d matrix when the vocabulary is shared (3-way tying, §3.4), else a
        source and a target matrix (the target one doubles as the pre-softmax projection).
        Attention: Q, K, V projections d -> h*d_k, h*d_k, h*d_v and W^O h*d_v -> d, with biases.
        FFN: d -> d_ff -> d with biases. LayerNorm: 2d each (2 per encoder layer, 3 per decoder
        layer, plus a final one per stack with pre-norm). Learned positions: max_positions x d
        per stack.
        """
        d, h = self.d_model, self.heads
        assert self.d_k is not None and self.d_v is not None
        attention = d * h * (2 * self.d_k + self.d_v) + h * (2 * self.d_k + self.d_v)
        attention += h * self.d_v * d + d
        ffn = d * self.d_ff + self.d_ff + self.d_ff * d + d
        norm = 2 * d
        encoder_layer = attention + ffn + 2 * norm
        decoder_layer = 2 * attention + ffn + 3 * norm
        total = self.encoder_layers * encoder_layer + self.decoder_layers * decoder_layer
        total += src_vocab * d if shared_vocab else (src_vocab + tgt_vocab) * d
        if self.norm == "pre":
            total += 2 * norm
        if self.embedding_norm:
            total += 2 * norm
        if self.positions == "learned":
            total += 2 * self.max_positions * d
        total += (0 if self.tied_output else tgt_vocab * d) + (tgt_vocab if self.output_bias else 0)
        return total


PRESETS: dict[str, ModelConfig] = {
    # Table 3, first and last rows.
    "base": ModelConfig(),
    "big": ModelConfig(d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    # The common IWSLT'14 de-en setting (fairseq's transformer_iwslt_de_en).
    "iwslt": ModelConfig(d_ff=1024, heads=4, dropout=0.3),
    # A model that trains on 2 CPU cores in minutes (Multi30k quickstart).
    "small": ModelConfig(encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4),
    # A distilled student (data/distill.sh): the encoder runs once per sentence, the one decoder
    # layer at every step of a search (Kasai et al., 2021: deep encoder, shallow decoder). 3 encoder
    # layers rather than 6, by measurement: in the recipe's 25 minutes on 2 cores it makes more
    # updates, scores higher and translates faster (tests/benchmarks/PERFORMANCE.md, session 29);
    # pre-norm, as the quickstart's rate left a post-norm encoder of 6 layers unused (session 26).
    "student": ModelConfig(encoder_layers=3, decoder_layers=1, d_model=256, d_ff=1024, heads=4, norm="pre"),
}


@dataclass(frozen=True)
class PaperRow:
    """A Table 3 row with a parameter count (millions), relative to the base model."""

    name: str
    overrides: dict[str, Any]
    params_m: float


TABLE3: tuple[PaperRow, ...] = (
    PaperRow("base", {}, 65),
    PaperRow("(B) d_k=16", {"d_k": 16}, 58),
    PaperRow("(B) d_k=32", {"d_k": 32}, 60),
    PaperRow("(C) N=2", {"encoder_layers": 2, "decoder_layers": 2}, 36),
    PaperRow("(C) N=4", {"encoder_layers": 4, "decoder_layers": 4}, 50),
    PaperRow("(C) N=8", {"encoder_layers": 8, "decoder_layers": 8}, 80),
    PaperRow("(C) d_model=256", {"d_model": 256, "d_k": 32, "d_v": 32}, 28),
    PaperRow("(C) d_model=1024", {"d_model": 1024, "d_k": 128, "d_v": 128}, 168),
    PaperRow("(C) d_ff=1024", {"d_ff": 1024}, 53),
    PaperRow("(C) d_ff=4096", {"d_ff": 4096}, 90),
    PaperRow("big", {"d_model": 1024, "d_ff": 4096, "heads": 16, "dropout": 0.3}, 213),
)

ARCHITECTURE_FIELDS = (
    "encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "d_k", "d_v", "positions", "norm", "activation",
    "scale_embeddings", "tied_output", "output_bias", "embedding_norm",
)


def paper_row(config: ModelConfig) -> PaperRow | None:
    """The Table 3 row whose architecture (not its dropout) equals `config`, if any."""
    def shape(c: ModelConfig) -> tuple:
        return tuple(getattr(c, name) for name in ARCHITECTURE_FIELDS)

    for row in TABLE3:
        if shape(PRESETS["base"].replace(**row.overrides)) == shape(config):
            return row
    return None
