"""Sampling (--sampling; back-translation): each output token drawn from the model's distribution
(at a temperature, among the top-k tokens or a nucleus), where beam search (search.py) keeps the
most probable hypotheses; the same decoder steps, controls and forced tokens."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.decode.controls import OutputControls
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import Hypothesis, forced_tokens, output_limits, penalty_of
from nmt_cli.device import steps_between_reads
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID


@torch.inference_mode()
def sample(models: Ensemble, src: Tensor, config: SearchConfig, generator: torch.Generator,
           prefixes: Tensor | None = None, columns: Tensor | None = None) -> list[list[Hypothesis]]:
    """`nbest` independent samples for each row of `src`, best first by score (--sampling): each
    token drawn from the model's distribution at `temperature`, among the `sampling_topk` most
    probable tokens or the nucleus of probability `sampling_topp` when given (back-translation).
    With a shortlist's `columns`, only their tokens. A sentence's samples are consecutive decoder
    rows; rows that finished wait for the others (the host reads whether all have finished every
    `device.steps_between_reads` steps)."""
    assert models.graphs is None, "sampling changes its number of rows: it runs without graphs"
    batch, n, device = src.size(0), config.nbest, src.device
    limits = output_limits(src, prefixes, config, models.max_positions)
    soonest_limit, states = int(limits.min()), models.start(src)
    layer = models.output_layer(columns)
    k = min(config.sampling_topk or layer.width, layer.width)
    controls, read_every = layer.controls(OutputControls.of(config, models.never, device)), steps_between_reads(device)
    history = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=device)
    log_prob = torch.zeros(batch * n, device=device)
    length = torch.zeros(batch * n, dtype=torch.long, device=device)
    done = torch.zeros(batch * n, dtype=torch.bool, device=device)
    for step in range(int(limits.max()) + 1):
        models.check_deadline()
        width = 1 if step == 0 else n  # the first step draws a sentence's n samples from its one row
        lp, ids = models.top_tokens(history, states, k, controls,
                                    forced_tokens(step, limits, soonest_limit, prefixes, width), layer=layer)
        choice = _draw(lp, config, generator, n if step == 0 else 1).view(batch * n, 1)
        if step == 0:
            origin = torch.arange(batch, device=device).repeat_interleave(n)
            lp, ids, history = lp[origin], ids[origin], history[origin]
            for state in states:
                state.reorder(origin)
        token = ids.gather(1, choice).squeeze(1).masked_fill(done, PAD_ID)
        log_prob += lp.gather(1, choice).squeeze(1).masked_fill(done, 0.0)
        length += ~done
        done |= token == EOS_ID
        history = torch.cat([history, token.unsqueeze(1)], dim=1)
        if (step + 1) % read_every == 0 and bool(done.all()):
            break
    history = history.cpu()  # one read for all samples, not one per sample
    penalty = penalty_of(config)
    samples = [Hypothesis(history[row, 1:size].tolist(), lp / penalty(size), lp)
               for row, (size, lp) in enumerate(zip(length.tolist(), log_prob.tolist()))]
    return [sorted(samples[i * n:(i + 1) * n], key=lambda h: -h.score) for i in range(batch)]


def _draw(lp: Tensor, config: SearchConfig, generator: torch.Generator, count: int) -> Tensor:
    """`count` draws (with replacement) per row from log-probabilities `lp` sorted best first."""
    logits = lp / config.temperature
    if config.sampling_topp is not None and config.sampling_topp < 1:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs.cumsum(-1) - probs >= config.sampling_topp, -math.inf)
    return torch.multinomial(logits.softmax(-1), count, replacement=True, generator=generator)
