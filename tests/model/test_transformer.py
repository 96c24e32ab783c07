"""The Transformer of §3: masks, positions, tying, gradients (decoding one position at a time:
decode/test_incremental.py)."""

import math

import pytest
import torch
from builders import PAD, TINY, random_tokens, tiny_model

from nmt_cli.model.transformer import Transformer, positional_encoding
from nmt_cli.text.vocab import BOS_ID, EOS_ID, model_ids


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_decoder_does_not_see_future_tokens(norm, positions):
    model = tiny_model(norm=norm, positions=positions)
    src, tgt = random_tokens(2, 6), random_tokens(2, 7)
    out = model(src, tgt)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = random_tokens(2, tgt.size(1) - t - 1)
        assert not torch.equal(changed, tgt)
        out2 = model(src, changed)
        torch.testing.assert_close(out2[:, : t + 1], out[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :], atol=1e-3)


def test_attention_dropout_applies_in_training_only():
    model = tiny_model(attention_dropout=0.5)
    src, tgt = random_tokens(2, 6), random_tokens(2, 5)
    evaluated = model(src, tgt)
    model.train()
    torch.manual_seed(1)
    trained = model(src, tgt)
    torch.manual_seed(1)
    torch.testing.assert_close(model(src, tgt), trained, rtol=0, atol=0)  # seeded
    assert not torch.allclose(trained, evaluated, atol=1e-3)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_changes_no_output(norm):
    model = tiny_model(norm=norm)
    src, tgt = random_tokens(1, 5), random_tokens(1, 4)
    ref = model(src, tgt)
    # The same sentence in a batch beside longer ones, right-padded on both sides.
    src_batch = torch.cat([torch.cat([src, torch.full((1, 3), PAD)], 1), random_tokens(1, 8)])
    tgt_batch = torch.cat([torch.cat([tgt, torch.full((1, 2), PAD)], 1), random_tokens(1, 6)])
    out = model(src_batch, tgt_batch)
    torch.testing.assert_close(out[0, :4], ref[0], rtol=0, atol=1e-5)


def test_source_padding_is_masked_not_merely_small():
    # Without the key mask the pad embeddings (zero + position) would change the result.
    model = tiny_model()
    src, tgt = random_tokens(1, 5), random_tokens(1, 4)
    padded = torch.cat([src, torch.full((1, 4), PAD)], 1)
    model.source_mask = lambda s: torch.ones(s.size(0), 1, 1, s.size(1), dtype=torch.bool)
    assert not torch.allclose(model(padded, tgt), model(src, tgt), atol=1e-4)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (123, 255)])
def test_positional_encoding_matches_formula(pos, i):
    d = 512
    pe = positional_encoding(200, d)
    angle = pos / 10000 ** (2 * i / d)
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_by_sqrt_d_model():
    model = tiny_model()
    tokens = random_tokens(1, 3)
    expected = model.src_embed.tokens(tokens) * math.sqrt(32) + positional_encoding(3, 32)
    torch.testing.assert_close(model.src_embed(tokens), expected)


def test_three_way_tying_shares_one_tensor():
    model = tiny_model(shared=True)
    weight = model.tgt_embed.tokens.weight
    assert model.src_embed.tokens.weight is weight
    with torch.no_grad():
        weight[5].fill_(3.0)
    h = torch.ones(1, 32)
    assert model.output_projection.weight is weight  # the pre-softmax projection too
    assert model.output_projection(h)[0, 5].item() == pytest.approx(3.0 * 32)
    assert torch.equal(model.src_embed.tokens(torch.tensor([5])), weight[5:6])


def test_two_way_tying_with_separate_vocabularies():
    model = tiny_model(shared=False)
    assert model.src_embed.tokens.weight is not model.tgt_embed.tokens.weight
    assert model.src_embed.tokens.weight.shape[0] == 23
    assert model.output_projection.weight is model.tgt_embed.tokens.weight
    assert model.output_projection(torch.ones(1, 32)).shape == (1, 31)
    params = sum(p.numel() for p in model.parameters())
    assert params == model.config.num_parameters(23, 31, shared_vocab=False)


def test_a_decoder_starting_from_eos_reads_its_row_for_the_start():
    """fairseq's models start a target from </s>'s row: <s> in a target reads </s>'s row there,
    and nowhere else (the source; the output's columns)."""
    ours = tiny_model()
    torch.manual_seed(0)
    fairseqs = Transformer(TINY.replace(decoder_start="eos"), 23, 23, PAD, True, **model_ids("eos", True)).eval()
    src, rest = random_tokens(2, 5), random_tokens(2, 3)
    start = torch.full((2, 1), BOS_ID)
    expected = ours(src, torch.cat([start.fill_(EOS_ID), rest], 1))
    torch.testing.assert_close(fairseqs(src, torch.cat([start.fill_(BOS_ID), rest], 1)), expected)
    assert fairseqs.encode(torch.tensor([[BOS_ID, 5]]))[0].allclose(ours.encode(torch.tensor([[BOS_ID, 5]]))[0])


def test_shared_vocabulary_needs_equal_sizes():
    with pytest.raises(ValueError, match="shared vocabulary"):
        Transformer(TINY, 23, 24, PAD, shared_vocab=True)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_gradient_reaches_every_parameter(norm, positions):
    model = tiny_model(norm=norm, positions=positions).train()
    src, tgt = random_tokens(2, 6), random_tokens(2, 5)
    model(src, tgt).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_sequence_beyond_max_positions_is_a_clear_error():
    model = tiny_model(max_positions=8)
    with pytest.raises(ValueError, match="max_positions=8"):
        model.encode(random_tokens(1, 9))


def test_pad_embedding_starts_at_zero():
    assert tiny_model().src_embed.tokens.weight[PAD].abs().sum() == 0
