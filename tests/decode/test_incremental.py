"""Incremental decoding: one position at a time over the growing caches gives what a full forward
gives, and the caches follow a search's reorders of rows and sentences."""

import pytest
import torch
from builders import PAD, random_tokens, tiny_model

from nmt_cli.decode import incremental as decoding


def step(model, tokens, state):
    """Logits of the next token of each row: the decoder's step, then the projection."""
    return model.output_projection(decoding.step_output(model, tokens, state))


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_decoding_equals_full_forward(norm, positions):
    model = tiny_model(norm=norm, positions=positions, d_k=6, d_v=10)
    src = torch.cat([random_tokens(3, 7)[:, :5], torch.full((3, 2), PAD)], 1)
    src[1] = random_tokens(1, 7)
    tgt = random_tokens(3, 9)
    full = model(src, tgt)
    state = decoding.start(model, src)
    steps = torch.stack([step(model, tgt[:, i], state) for i in range(tgt.size(1))], dim=1)
    assert (steps - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("reorders", [[[2, 0, 0]], [[2, 0, 1], [1, 1, 0]]], ids=["one", "two composed"])
def test_cache_reorders_follow_beams(reorders):
    """After 3 steps the rows (and sentences) are reordered, once or twice before the next step:
    the next steps give what a full forward of the rows taken gives."""
    model = tiny_model()
    src, tgt = random_tokens(3, 5), random_tokens(3, 6)
    state = decoding.start(model, src)
    for i in range(3):
        step(model, tgt[:, i], state)
    rows = torch.arange(3)
    for order in map(torch.tensor, reorders):
        state.reorder(order, sentences=order)
        rows = rows[order]
    steps = torch.stack([step(model, tgt[rows, i], state) for i in range(3, 6)], dim=1)
    full = model(src[rows], tgt[rows])[:, 3:]
    assert (steps - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("inference", [False, True])  # the cache copies differ with and without autograd
def test_beams_share_their_sentence_encoder_output_and_follow_reorders(inference):
    """Decoder rows grouped by sentence (3 beams each) read one encoder row per sentence; a
    reorder among beams, then one dropping a sentence, give what a full forward of the same
    rows gives."""
    model = tiny_model()
    src = torch.cat([random_tokens(2, 7)[:, :6], torch.full((2, 1), PAD)], 1)
    src[1] = random_tokens(1, 7)
    tgt = random_tokens(6, 6)  # rows 0-2: sentence 0, rows 3-5: sentence 1
    full = model(src[[1, 1, 1]], tgt[[5, 3, 3]])[:, 3:]
    with torch.inference_mode(inference):
        state = decoding.start(model, src)
        for i in range(2):
            step(model, tgt[:, i], state)
        beams = torch.tensor([1, 1, 0, 5, 3, 3])
        state.reorder(beams)
        step(model, tgt[beams, 2], state)
        state.reorder(torch.tensor([3, 4, 5]), sentences=torch.tensor([1]))  # sentence 0 is done
        rows = beams[3:]
        steps = torch.stack([step(model, tgt[rows, i], state) for i in range(3, 6)], dim=1)
    assert (steps - full).abs().max().item() < 1e-5
