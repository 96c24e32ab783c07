"""The Transformer of §3: masks, caching, positions, tying, gradients."""

import math

import pytest
import torch

from nmt_cli import kernels
from nmt_cli.architecture import PRESETS
from nmt_cli.model import Transformer, positional_encoding

PAD = 0
TINY = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0)


def tiny_model(seed: int = 0, shared: bool = True, **overrides) -> Transformer:
    torch.manual_seed(seed)
    tgt_vocab = 23 if shared else 31
    return Transformer(TINY.replace(**overrides), 23, tgt_vocab, PAD, shared).eval()


def random_tokens(batch: int, length: int, vocab: int = 23) -> torch.Tensor:
    return torch.randint(4, vocab, (batch, length))


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


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_written_out_attention_equals_the_fused_kernel(norm, monkeypatch):
    """Short sequences on the CPU take the written-out attention (the tests above check its
    masks); the fused kernel, which longer ones take, gives the same outputs and gradients."""
    import nmt_cli.model as model_module

    model = tiny_model(norm=norm).train()  # dropout 0: the two runs see the same function
    src = torch.cat([random_tokens(2, 9), torch.cat([random_tokens(1, 5), torch.full((1, 4), PAD)], 1)])
    tgt = torch.cat([random_tokens(2, 7), torch.cat([random_tokens(1, 3), torch.full((1, 4), PAD)], 1)])

    fused_calls = []
    sdpa = model_module.F.scaled_dot_product_attention
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention",
                        lambda *args, **kwargs: fused_calls.append(1) or sdpa(*args, **kwargs))

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = model(src, tgt)
        return out, list(torch.autograd.grad((out * torch.linspace(-1, 1, out.size(-1))).sum(), model.parameters()))

    written_out, written_out_grads = run()
    assert not fused_calls  # every attention of the model written out
    monkeypatch.setattr(kernels, "WRITTEN_OUT_MAX_KEYS", 0)
    fused, fused_grads = run()
    layers = model.config.encoder_layers + 2 * model.config.decoder_layers
    assert len(fused_calls) == layers  # and now every one fused
    torch.testing.assert_close(written_out, fused, rtol=0, atol=1e-5)
    for a, b in zip(written_out_grads, fused_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


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


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_decoding_equals_full_forward(norm, positions):
    model = tiny_model(norm=norm, positions=positions, d_k=6, d_v=10)
    src = torch.cat([random_tokens(3, 7)[:, :5], torch.full((3, 2), PAD)], 1)
    src[1] = random_tokens(1, 7)
    tgt = random_tokens(3, 9)
    full = model(src, tgt)
    memory, src_mask = model.encode(src)
    state = model.init_state(memory, src_mask)
    steps = torch.stack([model.decode_step(tgt[:, i], state) for i in range(tgt.size(1))], dim=1)
    assert (steps - full).abs().max().item() < 1e-5


def test_cache_reorder_follows_beams():
    model = tiny_model()
    src, tgt = random_tokens(3, 5), random_tokens(3, 6)
    memory, src_mask = model.encode(src)
    state = model.init_state(memory, src_mask)
    for i in range(3):
        model.decode_step(tgt[:, i], state)
    order = torch.tensor([2, 0, 0])
    state.reorder(order, sentences=order)
    steps = torch.stack([model.decode_step(tgt[order, i], state) for i in range(3, 6)], dim=1)
    full = model(src[order], tgt[order])[:, 3:]
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
        state = model.init_state(*model.encode(src))
        for i in range(2):
            model.decode_step(tgt[:, i], state)
        beams = torch.tensor([1, 1, 0, 5, 3, 3])
        state.reorder(beams)
        model.decode_step(tgt[beams, 2], state)
        state.reorder(torch.tensor([3, 4, 5]), sentences=torch.tensor([1]))  # sentence 0 is done
        rows = beams[3:]
        steps = torch.stack([model.decode_step(tgt[rows, i], state) for i in range(3, 6)], dim=1)
    assert (steps - full).abs().max().item() < 1e-5


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
    assert model.project(h)[0, 5].item() == pytest.approx(3.0 * 32)
    assert torch.equal(model.src_embed.tokens(torch.tensor([5])), weight[5:6])


def test_two_way_tying_with_separate_vocabularies():
    model = tiny_model(shared=False)
    assert model.src_embed.tokens.weight is not model.tgt_embed.tokens.weight
    assert model.src_embed.tokens.weight.shape[0] == 23
    assert model.project(torch.ones(1, 32)).shape == (1, 31)
    params = sum(p.numel() for p in model.parameters())
    assert params == model.config.num_parameters(23, 31, shared_vocab=False)


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


def test_reorders_between_two_steps_compose():
    model = tiny_model()
    src, tgt = random_tokens(3, 5), random_tokens(3, 5)
    state = model.init_state(*model.encode(src))
    for i in range(2):
        model.decode_step(tgt[:, i], state)
    first, second = torch.tensor([2, 0, 1]), torch.tensor([1, 1, 0])
    state.reorder(first, sentences=first)
    state.reorder(second, sentences=second)
    rows = first[second]  # [0, 0, 2]
    steps = torch.stack([model.decode_step(tgt[rows, i], state) for i in range(2, 5)], dim=1)
    full = model(src[rows], tgt[rows])[:, 2:]
    assert (steps - full).abs().max().item() < 1e-5
