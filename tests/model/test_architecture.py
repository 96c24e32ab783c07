"""Presets, overrides and the analytic parameter count against built models."""

import pytest

from nmt_cli.model.architecture import PRESETS, TABLE3, ModelConfig, paper_row
from nmt_cli.model.transformer import Transformer


def built_params(config: ModelConfig, vocab: int) -> int:
    model = Transformer(config, vocab, vocab, pad_index=0, shared_vocab=True)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "config",
    [
        PRESETS["base"],
        PRESETS["big"],
        PRESETS["base"].replace(d_k=16),  # Table 3 (B)
        PRESETS["base"].replace(d_model=256, d_k=32, d_v=32),  # Table 3 (C)
        PRESETS["small"].replace(positions="learned", norm="pre", heads=5, d_k=7, d_v=11),
    ],
    ids=["base", "big", "B-dk16", "C-d256", "small-variant"],
)
@pytest.mark.slow
def test_analytic_count_equals_built_model(config):
    assert config.num_parameters(37000, 37000, shared_vocab=True) == built_params(config, 37000)


def test_base_and_big_counts_by_hand():
    # base: 37000*512 + 6*(4*(512*512+512) + (512*2048+2048+2048*512+512) + 2*1024)
    #       + 6*(8*(512*512+512) + ... + 3*1024) = 63,082,496 (PAPER.md: about 63.1M)
    assert PRESETS["base"].num_parameters(37000, 37000, True) == 63_082_496
    assert round(PRESETS["big"].num_parameters(37000, 37000, True) / 1e6) == 214


def test_table3_rows_are_close_to_paper_counts():
    for row in TABLE3:
        config = PRESETS["base"].replace(**row.overrides)
        ours = config.num_parameters(37000, 37000, True) / 1e6
        assert abs(ours - row.params_m) / row.params_m < 0.12, row.name
        assert paper_row(config) is row


def test_presets_are_the_papers():
    base, big = PRESETS["base"], PRESETS["big"]
    assert (base.encoder_layers, base.d_model, base.d_ff, base.heads, base.d_k, base.d_v) == (6, 512, 2048, 8, 64, 64)
    assert (base.dropout, base.label_smoothing, base.norm, base.positions) == (0.1, 0.1, "post", "sinusoidal")
    assert (big.d_model, big.d_ff, big.heads, big.d_k, big.dropout) == (1024, 4096, 16, 64, 0.3)
    assert (PRESETS["iwslt"].d_ff, PRESETS["iwslt"].heads, PRESETS["iwslt"].dropout) == (1024, 4, 0.3)
    small = PRESETS["small"]
    assert (small.encoder_layers, small.d_model, small.d_ff, small.heads) == (3, 256, 1024, 4)


def test_heads_override_rederives_head_dimensions():
    assert PRESETS["base"].replace(heads=16).d_k == 32
    assert PRESETS["base"].replace(heads=16, d_k=64).d_k == 64


def test_round_trip_through_dict():
    config = PRESETS["big"].replace(positions="learned")
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown"):
        ModelConfig.from_dict({**config.to_dict(), "bogus": 1})


@pytest.mark.parametrize(
    "overrides,message",
    [({"dropout": 1.0}, "dropout"), ({"heads": 0}, "heads"), ({"norm": "mid"}, "norm"),
     ({"d_model": 100, "heads": 8}, "divisible")],
)
def test_invalid_configs_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        PRESETS["base"].replace(**overrides)
