"""What a search step may output, given each decoder row's output so far: never the banned tokens
(padding, BOS, <unk> unless --allow-unk, a vocabulary's fillers), no </s> before --min-len target
tokens, no target n-gram twice (--no-repeat-ngram-size), and the log-probability of a token
already in the output multiplied by --repetition-penalty (log-probabilities are at most 0, so a
penalty above 1 makes repeats less likely: transformers' beam search). search.py applies them to
every step's log-probabilities, before a forced token (a prefix, </s> at the length limit) is
put in; each works on whole tensors, so a step reads nothing back to the host."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID


@dataclass(frozen=True)
class OutputControls:
    banned: Tensor  # token ids never output
    min_len: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    eos: int = EOS_ID  # its column (ensemble.OutputLayer: a shortlist's columns are not the vocabulary's ids)

    @classmethod
    def of(cls, config: SearchConfig, never: list[int], device: torch.device) -> OutputControls:
        banned = torch.tensor(banned_ids(config, never), device=device)
        return cls(banned, config.min_len, config.no_repeat_ngram_size, config.repetition_penalty)

    def apply(self, lp: Tensor, output: Tensor, step: int) -> None:
        """Apply the controls in place to `lp` (rows, vocab), the log-probabilities of each row's
        next token; `output` (rows, step) holds the rows' target tokens so far."""
        if self.repetition_penalty != 1.0 and output.size(1):
            lp.scatter_(1, output, lp.gather(1, output) * self.repetition_penalty)
        lp.index_fill_(1, self.banned, -math.inf)  # not `lp[:, banned] = x`: on a GPU, a copy from the host
        if step < self.min_len:
            lp[:, self.eos] = -math.inf
        n = self.no_repeat_ngram_size
        if n and output.size(1) >= n:
            lp.masked_fill_(repeated_ngram_ends(output, n, lp.size(1)), -math.inf)


def banned_ids(config: SearchConfig, never: list[int]) -> list[int]:
    """The ids a search never outputs: padding, BOS, <unk> unless --allow-unk, and `never` (a
    vocabulary's fillers, a release's banned tokens)."""
    return [PAD_ID, BOS_ID] + ([] if config.allow_unk else [UNK_ID]) + never


def repeated_ngram_ends(output: Tensor, n: int, vocab: int) -> Tensor:
    """(rows, vocab): the tokens that would end an n-gram already in the row's `output` (rows,
    length >= n): those that follow each earlier occurrence of the output's last n - 1 tokens."""
    grams = output.unfold(1, n, 1)  # (rows, length - n + 1, n)
    follows_the_end = (grams[:, :, :-1] == output[:, output.size(1) - n + 1:].unsqueeze(1)).all(-1)
    hits = torch.zeros(output.size(0), vocab, dtype=torch.int32, device=output.device)
    return hits.scatter_add_(1, grams[:, :, -1], follows_the_end.int()) > 0
