"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), §3.

Tensors are batch-first: tokens are (batch, length) int64, hidden states (batch, length, d_model).
Padding is marked by `pad_index`; a source key padding mask is True where a token is real.

The decoder runs over a whole target prefix (training, teacher forcing), or one position at a
time over caches of the earlier positions' keys and values (search: decode/incremental.py); both give the
same numbers. This file is the paper only: machine-specific fast paths (kernels.py) and int8
quantization are module swaps applied from outside.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.model.architecture import ModelConfig


def positional_encoding(length: int, d_model: int, offset: int = 0) -> Tensor:
    """Sinusoidal positions, §3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).
    Computed on the CPU, also while a model is built on the meta device (checkpoint.checked_model)."""
    position = torch.arange(offset, offset + length, dtype=torch.float64, device="cpu").unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")
    angle = position / torch.pow(10000.0, two_i / d_model)
    pe = torch.zeros(length, d_model, dtype=torch.float64, device="cpu")
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(d_model) plus positions, then dropout (§3.4, §3.5, §5.4); with
    `embedding_norm` (not the paper's: BART's), a layer norm before the dropout."""

    def __init__(self, tokens: nn.Embedding, config: ModelConfig, start: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.tokens = tokens
        self.start = start  # (the id a target starts with, the row it reads) where they differ
        self.scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        self.learned = (
            nn.Embedding(config.max_positions, config.d_model) if config.positions == "learned" else None
        )
        if self.learned is None:
            table = positional_encoding(config.max_positions, config.d_model)
            self.register_buffer("sinusoid", table, persistent=False)
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.embedding_norm else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, tokens: Tensor, offset: int | Tensor = 0) -> Tensor:
        """`tokens` at positions offset, offset + 1, ...; a search step's one position may be a
        (1,) tensor, so that its value stays on the device (graphs.StaticDecoder)."""
        length = tokens.size(1)
        table = self.learned.weight if self.learned is not None else self.sinusoid
        if isinstance(offset, Tensor):
            positions = table.index_select(0, offset)
        elif offset + length > table.size(0):
            raise ValueError(f"sequence of {offset + length} tokens exceeds max_positions={table.size(0)}")
        else:
            positions = table[offset : offset + length]
        if self.start is not None:
            tokens = tokens.masked_fill(tokens == self.start[0], self.start[1])
        x = self.tokens(tokens) * self.scale + positions.to(self.tokens.weight.dtype)
        return self.dropout(x if self.norm is None else self.norm(x))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
              dropout: nn.Module) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, eq. 1: softmax(Q K^T / sqrt(d_k)) V, per head.

    `mask` is True on the keys a query may see; `causal` hides later positions (§3.2.3);
    dropout applies to the weights. Returns the output and the weights."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        future = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return dropout(weights) @ v, weights


class ScaledDotProductAttention(nn.Module):
    """Eq. 1 for all heads at once, with dropout on the weights: torch's fused kernel, or
    `attention` written out while the weights are kept for inspection (`keep_weights`)."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.keep_weights = False  # set by Transformer.attention_weights
        self.weights: Tensor | None = None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        if self.keep_weights:
            out, self.weights = attention(q, k, v, mask, causal, self.dropout)
            return out
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              dropout_p=self.dropout.p if self.training else 0.0)


class KeyValueCache(Protocol):
    """The keys and values of a self-attention layer's earlier positions (decode/incremental.py, decode/graphs.py)."""

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Those of every position so far, the new one's (`k`, `v`) included, and the mask of
        the positions to attend to (None: all)."""


class MultiHeadAttention(nn.Module):
    """Multi-head attention, §3.2.2, over scaled dot-product attention (eq. 1).

    Self-attention projects Q, K, V with one fused matrix; encoder-decoder attention projects Q
    from the decoder and K, V (fused) from the encoder output. Both are the paper's per-head
    matrices W^Q_i, W^K_i, W^V_i laid side by side, so the parameter count is the paper's.
    """

    def __init__(self, config: ModelConfig, self_attention: bool) -> None:
        super().__init__()
        assert config.d_k is not None and config.d_v is not None
        self.heads, self.d_k, self.d_v = config.heads, config.d_k, config.d_v
        qk, v = self.heads * self.d_k, self.heads * self.d_v
        if self_attention:
            self.qkv = nn.Linear(config.d_model, 2 * qk + v)
        else:
            self.q = nn.Linear(config.d_model, qk)
            self.kv = nn.Linear(config.d_model, qk + v)
        self.out = nn.Linear(v, config.d_model)  # W^O
        self.attention = ScaledDotProductAttention(config.attention_dropout)

    def split_heads(self, x: Tensor, dim: int) -> Tensor:
        """(batch, length, heads * dim) -> (batch, heads, length, dim)."""
        return x.unflatten(-1, (self.heads, dim)).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output; computed once per source batch."""
        k, v = self.kv(memory).split([self.heads * self.d_k, self.heads * self.d_v], dim=-1)
        return self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qk = self.heads * self.d_k
        q, k, v = self.qkv(x).split([qk, qk, self.heads * self.d_v], dim=-1)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """softmax(Q K^T / sqrt(d_k)) V for all heads, concatenated and projected by W^O."""
        return self.out(self.attention(q, k, v, mask, causal).transpose(1, 2).flatten(2))

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False,
                cache: KeyValueCache | None = None) -> Tensor:
        """Self-attention over `x`; `mask` (batch, 1, 1, length) is True on real keys. With a
        `cache` of the earlier positions, `x` is the next position and attends to all of them."""
        q, k, v = self.project_qkv(x)
        if cache is not None:
            k, v, mask = cache.extend(k, v)
            causal = False
        return self.attend(q, k, v, mask, causal)

    def attend_to(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], mask: Tensor) -> Tensor:
        """Encoder-decoder attention of `x` to the encoder's keys and values. `x` may hold several
        rows per sentence of `memory_kv` (a search's beams, a sentence's rows together): they
        attend together, sharing the sentence's keys and values."""
        grouped = x.reshape(memory_kv[0].size(0), -1, x.size(-1))
        return self.attend(self.project_q(grouped), *memory_kv, mask, causal=False).view_as(x)

    def project_q(self, x: Tensor) -> Tensor:
        """Queries of encoder-decoder attention, from the decoder."""
        return self.split_heads(self.q(x), self.d_k)


def gelu_sigmoid(x: Tensor) -> Tensor:
    """GELU's sigmoid approximation x sigmoid(1.702 x) (Hendrycks and Gimpel, 2016), Marian's `gelu`."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu-tanh": lambda x: F.gelu(x, approximate="tanh"),
               "gelu-sigmoid": gelu_sigmoid, "swish": F.silu}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, eq. 2 (another nonlinearity than max(0, .) for some
    released models: `ModelConfig.activation`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.relu_dropout)
        self.activation = ACTIVATIONS[config.activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(self.activation(self.w1(x))))


class SublayerConnection(nn.Module):
    """Residual connection with dropout and layer normalization, §3.1 and §5.4.

    post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    pre-norm (later variant): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.pre_norm = config.norm == "pre"

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual sub-layer (§3.1)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config, self_attention=True)
        self.ffn = PositionwiseFeedForward(config)
        self.sublayers = nn.ModuleList(SublayerConnection(config) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda y: self.self_attn(y, src_mask))
        return self.sublayers[1](x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (§3.1)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config, self_attention=True)
        self.cross_attn = MultiHeadAttention(config, self_attention=False)
        self.ffn = PositionwiseFeedForward(config)
        self.sublayers = nn.ModuleList(SublayerConnection(config) for _ in range(3))

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], src_mask: Tensor,
                cache: KeyValueCache | None = None) -> Tensor:
        """`x` is the target prefix, masked causally; with the `cache` of the earlier positions,
        the next position."""
        x = self.sublayers[0](x, lambda y: self.self_attn(y, causal=True, cache=cache))
        x = self.sublayers[1](x, lambda y: self.cross_attn.attend_to(y, memory_kv, src_mask))
        return self.sublayers[2](x, self.ffn)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (§3, Figure 1) with shared embeddings (§3.4).

    With a shared (joint) vocabulary one matrix serves as source embedding, target embedding and
    pre-softmax projection; otherwise the target embedding and the projection are tied. (Some
    released models untie the projection or give it a bias: `tied_output`, `output_bias`; fairseq's
    start a target from </s>'s row: `decoder_start`, where `start` is (the id a target starts with,
    the row it reads); OpenNMT-py's read a source without </s>: `source_eos`, where `unseen_end` is
    the id a source ends with, which the encoder then masks as padding.)
    """

    def __init__(self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_index: int, shared_vocab: bool, start: tuple[int, int] | None = None,
                 unseen_end: int | None = None) -> None:
        super().__init__()
        if shared_vocab and src_vocab_size != tgt_vocab_size:
            raise ValueError("a shared vocabulary needs equal source and target vocabulary sizes")
        self.config, self.pad_index, self.unseen_end = config, pad_index, unseen_end
        tgt_tokens = nn.Embedding(tgt_vocab_size, config.d_model, padding_idx=pad_index)
        src_tokens = tgt_tokens if shared_vocab else nn.Embedding(
            src_vocab_size, config.d_model, padding_idx=pad_index)
        self.src_embed = Embedding(src_tokens, config)
        self.tgt_embed = Embedding(tgt_tokens, config, start)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        pre_norm = config.norm == "pre"
        self.encoder_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if pre_norm else nn.Identity()
        # The pre-softmax linear transformation (§3.4). Tied, it is made on the meta device: it takes the
        # target embedding's matrix (tie_weights), so drawing a weight of its own would only use random numbers.
        self.output_projection = nn.Linear(config.d_model, tgt_vocab_size, bias=False,
                                           device="meta" if config.tied_output else None)
        if config.output_bias:
            self.output_projection.bias = nn.Parameter(torch.zeros(tgt_vocab_size))
        self.tie_weights()
        self.reset_parameters()

    def tie_weights(self) -> None:
        """The pre-softmax projection shares the target embedding's matrix (§3.4), unless untied."""
        if self.config.tied_output:
            self.output_projection.weight = self.tgt_embed.tokens.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform projections with zero biases; embeddings (and an untied pre-softmax
        projection) N(0, d_model^-0.5), pad row 0."""
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        matrices = [self.src_embed.tokens.weight, self.tgt_embed.tokens.weight, self.output_projection.weight]
        for weight in {id(w): w for w in matrices}.values():  # each tied matrix once, in this order
            nn.init.normal_(weight, mean=0.0, std=self.config.d_model ** -0.5)
            with torch.no_grad():
                weight[self.pad_index].zero_()
        for embed in (self.src_embed, self.tgt_embed):
            if embed.learned is not None:
                nn.init.normal_(embed.learned.weight, mean=0.0, std=self.config.d_model ** -0.5)

    def source_mask(self, src: Tensor) -> Tensor:
        """(batch, 1, 1, src_len), True on real tokens: broadcast over heads and queries."""
        real = src != self.pad_index
        if self.unseen_end is not None:
            real &= src != self.unseen_end
        return real[:, None, None, :]

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Encoder stack over source tokens (attending where `src_mask` is True: by default
        `source_mask`); returns (memory, source mask)."""
        src_mask = self.source_mask(src) if src_mask is None else src_mask
        x = self.src_embed(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def memory_keys_values(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's keys and values of the encoder output (computed once per source)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]

    def decode(self, tgt_in: Tensor, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor,
               caches: list[KeyValueCache] | None = None, offset: int | Tensor = 0) -> Tensor:
        """The decoder stack's output for every position of a target prefix, causally masked; or,
        with each layer's cache of the earlier positions, for the next `offset` position."""
        x = self.tgt_embed(tgt_in, offset)
        for layer, kv, cache in zip(self.decoder_layers, memory_kv, caches or [None] * len(memory_kv)):
            x = layer(x, kv, src_mask, cache)
        return self.decoder_norm(x)

    def features(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The decoder's output for every target position, before the pre-softmax projection."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, self.memory_keys_values(memory), src_mask)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (batch, target length, vocabulary) of every next token (teacher forcing)."""
        return self.output_projection(self.features(src, tgt_in))

    @torch.no_grad()
    def attention_weights(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """Attention distributions of a forward pass (§4, appendix), per layer, (batch, heads, queries, keys):
        "encoder" self-attention, "decoder" (masked) self-attention, "cross" encoder-decoder attention."""
        groups = {"encoder": [layer.self_attn.attention for layer in self.encoder_layers],
                  "decoder": [layer.self_attn.attention for layer in self.decoder_layers],
                  "cross": [layer.cross_attn.attention for layer in self.decoder_layers]}
        modules = [m for group in groups.values() for m in group]
        try:
            for m in modules:
                m.keep_weights = True
            self(src, tgt_in)
            return {name: [m.weights for m in group] for name, group in groups.items()}
        finally:
            for m in modules:
                m.keep_weights, m.weights = False, None
