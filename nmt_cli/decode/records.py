"""What a translation gives back: its n-best `Translation`s and a given target's `Scored`
log-probabilities (the Python API's results), and the JSON records that `nmt translate --format
jsonl` and `nmt serve` write of them, with the encoder-decoder attention (scores rounded to 6
decimals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nmt_cli.errors import NmtError


@dataclass
class Translation:
    """One hypothesis: its text (in the output format), subword tokens, score (log-probability
    over the length penalty, §6.1) and log-probability; its alignment where asked for
    (`attention_record`'s); with constraints, the phrases to include that it lacks."""

    text: str
    tokens: list[str]
    score: float
    log_prob: float
    alignment: dict[str, Any] | None = None
    missing: list[str] | None = None


@dataclass
class Scored:
    """A given target under the model: its log-probability, its score (over the length penalty,
    as a search would score it), and each token's log-probability, </s> last."""

    log_prob: float
    score: float
    tokens: list[str]
    token_log_probs: list[float]


def translations_record(number: int, nbest: list[Translation]) -> dict[str, Any]:
    """A line's translations, best first ("translation": the best; empty for an empty line)."""
    hypotheses = [{"text": t.text, "tokens": t.tokens, "score": round(t.score, 6), "log_prob": round(t.log_prob, 6),
                   **({"missing": t.missing} if t.missing is not None else {})} for t in nbest]
    return {"line": number, "translation": hypotheses[0]["text"] if hypotheses else "", "nbest": hypotheses}


def attention_record(weights: dict[str, list[Tensor]], layer: int | None,
                     labels: tuple[list[str], list[str]]) -> dict[str, Any]:
    """The encoder-decoder attention of decoder `layer` (default: the last), heads averaged:
    one row of source weights per output token, for alignment."""
    layers = weights["cross"]
    layer = layer or len(layers)
    if not 1 <= layer <= len(layers):
        raise NmtError(f"--attention-layer {layer}: the model has {len(layers)} decoder layers")
    matrix = layers[layer - 1][0].mean(0).float().cpu()  # (output tokens, source tokens)
    return {"layer": layer, "src_tokens": labels[0], "tgt_tokens": labels[1],
            "weights": [[round(w, 5) for w in row] for row in matrix.tolist()]}


def score_record(number: int, scored: Scored) -> dict[str, Any]:
    """A given target's log-probability under the model, its length-penalized score, and each
    token's log-probability (</s> last)."""
    return {"line": number, "log_prob": round(scored.log_prob, 6), "score": round(scored.score, 6),
            "tokens": scored.tokens, "token_log_probs": [round(lp, 6) for lp in scored.token_log_probs]}
