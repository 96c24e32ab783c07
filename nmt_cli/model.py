"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), §3.

Tensors are batch-first: tokens are (batch, length) int64, hidden states (batch, length, d_model).
Padding is marked by `pad_index`; a source key padding mask is True where a token is real.

The decoder runs in two ways that give the same numbers: `decode` over a whole target prefix
(training, teacher forcing) and `decode_step` one token at a time over a `DecoderState` that
caches every layer's keys and values (search).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.architecture import ModelConfig
from nmt_cli.kernels import Dropout, append_position, written_out_attention


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
    """Token embedding scaled by sqrt(d_model) plus positions, then dropout (§3.4, §3.5, §5.4)."""

    def __init__(self, tokens: nn.Embedding, config: ModelConfig) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(config.d_model)
        self.learned = (
            nn.Embedding(config.max_positions, config.d_model) if config.positions == "learned" else None
        )
        if self.learned is None:
            table = positional_encoding(config.max_positions, config.d_model)
            self.register_buffer("sinusoid", table, persistent=False)
        self.dropout = Dropout(config.dropout)

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
        return self.dropout(self.tokens(tokens) * self.scale + positions.to(self.tokens.weight.dtype))


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
        self.dropout = Dropout(config.attention_dropout)  # on the attention weights
        self.keep_weights = False  # set by Transformer.attention_weights
        self.weights: Tensor | None = None

    def split_heads(self, x: Tensor, dim: int) -> Tensor:
        """(batch, length, heads * dim) -> (batch, heads, length, dim)."""
        return x.unflatten(-1, (self.heads, dim)).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output; computed once per source batch."""
        k, v = self.kv(memory).split([self.heads * self.d_k, self.heads * self.d_v], dim=-1)
        return self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def project_q(self, x: Tensor) -> Tensor:
        """Queries of encoder-decoder attention, from the decoder."""
        return self.split_heads(self.q(x), self.d_k)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qk = self.heads * self.d_k
        q, k, v = self.qkv(x).split([qk, qk, self.heads * self.d_v], dim=-1)
        return self.split_heads(q, self.d_k), self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
               step: bool = False) -> Tensor:
        """softmax(Q K^T / sqrt(d_k)) V for all heads, concatenated and projected by W^O.

        Written out (`attention`) to keep the weights for inspection, at a search step, and where
        that is faster (`kernels.written_out_attention`); else torch's fused kernel."""
        if self.keep_weights or step or written_out_attention(q, k):
            out, weights = attention(q, k, v, mask, causal, self.dropout)
            if self.keep_weights:
                self.weights = weights
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal,
                dropout_p=self.dropout.p if self.training else 0.0,
            )
        return self.out(out.transpose(1, 2).flatten(2))

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """Self-attention over `x`; `mask` (batch, 1, 1, length) is True on real keys."""
        q, k, v = self.project_qkv(x)
        return self.attend(q, k, v, mask, causal)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, eq. 2."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, config.d_model)
        self.dropout = Dropout(config.relu_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(F.relu(self.w1(x))))


class SublayerConnection(nn.Module):
    """Residual connection with dropout and layer normalization, §3.1 and §5.4.

    post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    pre-norm (later variant): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = Dropout(config.dropout)
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
                cache: GrowingCache | None = None, rows: Tensor | None = None) -> Tensor:
        """Without `cache`, `x` is the whole target prefix, masked causally. With the `cache` of
        earlier positions' keys and values, `x` is the next position: the cache takes its rows
        `rows` (the beams a search kept) if given, and is extended by `x`'s keys and values.

        `x` may hold several rows per sentence of `memory_kv` (the beams of a search, each
        sentence's rows together): they share that sentence's encoder keys and values.
        """
        step = cache is not None

        def self_attention(y: Tensor) -> Tensor:
            q, k, v = self.self_attn.project_qkv(y)
            if not step:
                return self.self_attn.attend(q, k, v, None, causal=True)
            k, v, mask = cache.extend(k, v, rows)
            return self.self_attn.attend(q, k, v, mask, causal=False, step=True)

        def cross_attention(y: Tensor) -> Tensor:
            # one sentence's queries (rows x positions) attend together to its encoder output
            grouped = y.reshape(memory_kv[0].size(0), -1, y.size(-1))
            out = self.cross_attn.attend(self.cross_attn.project_q(grouped), *memory_kv, src_mask, causal=False,
                                         step=step)
            return out.view_as(y)

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, cross_attention)
        return self.sublayers[2](x, self.ffn)


class GrowingCache:
    """A decoder layer's self-attention keys and values of the positions so far, one row per
    decoder row; each step copies them once, taking the rows a search kept and adding its own."""

    def __init__(self) -> None:
        self.kv: tuple[Tensor, Tensor] | None = None

    def extend(self, k: Tensor, v: Tensor, rows: Tensor | None) -> tuple[Tensor, Tensor, None]:
        """Keys and values of every position so far (no mask needed: all are real)."""
        if self.kv is not None:
            k, v = append_position(self.kv[0], k, rows), append_position(self.kv[1], v, rows)
        self.kv = (k, v)
        return k, v, None


class DecoderState:
    """What `decode_step` needs between steps: the encoder's keys/values per layer and the
    source mask (one row per sentence), each layer's self-attention cache (one row per decoder
    row: a sentence's beams are consecutive rows), the cache rows to take at the next step, and
    the next position."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        self.memory_kv = memory_kv
        self.src_mask = src_mask
        self.caches = [GrowingCache() for _ in memory_kv]
        self.rows: Tensor | None = None
        self.position = 0

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Continue from decoder rows `rows` (the beams a search kept), and where sentences are
        dropped or repeated, keep the encoder entries of `sentences`.

        The caches take their rows at the next step, in the same copy that extends them.
        """
        if sentences is not None:
            self.memory_kv = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.memory_kv]
            self.src_mask = self.src_mask.index_select(0, sentences)
        self.rows = rows if self.rows is None else self.rows.index_select(0, rows)

    def advance(self) -> None:
        self.position, self.rows = self.position + 1, None


class Transformer(nn.Module):
    """Encoder-decoder Transformer (§3, Figure 1) with shared embeddings (§3.4).

    With a shared (joint) vocabulary one matrix serves as source embedding, target embedding and
    pre-softmax projection; otherwise the target embedding and the projection are tied.
    """

    def __init__(self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_index: int, shared_vocab: bool) -> None:
        super().__init__()
        if shared_vocab and src_vocab_size != tgt_vocab_size:
            raise ValueError("a shared vocabulary needs equal source and target vocabulary sizes")
        self.config, self.pad_index = config, pad_index
        tgt_tokens = nn.Embedding(tgt_vocab_size, config.d_model, padding_idx=pad_index)
        src_tokens = tgt_tokens if shared_vocab else nn.Embedding(
            src_vocab_size, config.d_model, padding_idx=pad_index)
        self.src_embed = Embedding(src_tokens, config)
        self.tgt_embed = Embedding(tgt_tokens, config)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        pre_norm = config.norm == "pre"
        self.encoder_norm = nn.LayerNorm(config.d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model) if pre_norm else nn.Identity()
        self.int8_projection: nn.Module | None = None  # set by kernels.quantize_int8
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections with zero biases; embeddings N(0, d_model^-0.5), pad row 0."""
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for embedding in {self.src_embed.tokens, self.tgt_embed.tokens}:
            nn.init.normal_(embedding.weight, mean=0.0, std=self.config.d_model ** -0.5)
            with torch.no_grad():
                embedding.weight[self.pad_index].zero_()
        for embed in (self.src_embed, self.tgt_embed):
            if embed.learned is not None:
                nn.init.normal_(embed.learned.weight, mean=0.0, std=self.config.d_model ** -0.5)

    def source_mask(self, src: Tensor) -> Tensor:
        """(batch, 1, 1, src_len), True on real tokens: broadcast over heads and queries."""
        return (src != self.pad_index)[:, None, None, :]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder stack over source tokens; returns (memory, source mask)."""
        src_mask = self.source_mask(src)
        x = self.src_embed(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def project(self, x: Tensor) -> Tensor:
        """Pre-softmax linear transformation, tied to the target embedding (§3.4)."""
        if self.int8_projection is not None:
            return self.int8_projection(x)
        return F.linear(x, self.tgt_embed.tokens.weight)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, keep: Tensor | None = None) -> Tensor:
        """Logits for every position of a target prefix (teacher forcing), causally masked.

        With `keep` (a boolean mask like `tgt_in`), only the kept positions are projected to the
        vocabulary, flattened to (kept, vocab): training skips the padding's largest matmul.
        """
        x = self.tgt_embed(tgt_in)
        for layer in self.decoder_layers:
            x = layer(x, layer.cross_attn.project_kv(memory), src_mask)
        x = self.decoder_norm(x)
        return self.project(x if keep is None else x[keep])

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask, keep)

    @torch.no_grad()
    def attention_weights(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """Attention distributions of a forward pass (§4, appendix), per layer, (batch, heads, queries, keys):
        "encoder" self-attention, "decoder" (masked) self-attention, "cross" encoder-decoder attention."""
        groups = {"encoder": [layer.self_attn for layer in self.encoder_layers],
                  "decoder": [layer.self_attn for layer in self.decoder_layers],
                  "cross": [layer.cross_attn for layer in self.decoder_layers]}
        modules = [m for group in groups.values() for m in group]
        try:
            for m in modules:
                m.keep_weights = True
            self(src, tgt_in)
            return {name: [m.weights for m in group] for name, group in groups.items()}
        finally:
            for m in modules:
                m.keep_weights, m.weights = False, None

    def init_state(self, memory: Tensor, src_mask: Tensor) -> DecoderState:
        """Project the encoder output to each decoder layer's keys/values once, each laid out
        contiguously (as views of the fused projection, every step's attention would copy them)."""
        memory_kv = [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]
        return DecoderState([(k.contiguous(), v.contiguous()) for k, v in memory_kv], src_mask)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Logits (batch, vocab) for the next token, given the last tokens (batch,); updates `state`."""
        return self.project(self.step_output(tokens, state))

    def step_output(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """The decoder's output (batch, d_model) for the next token, before the projection to the
        vocabulary; updates `state`."""
        x = self.tgt_embed(tokens[:, None], offset=state.position)
        for layer, kv, cache in zip(self.decoder_layers, state.memory_kv, state.caches):
            x = layer(x, kv, state.src_mask, cache, state.rows)
        state.advance()
        return self.decoder_norm(x)[:, 0]
