"""The trainer's pieces that stand alone: the exponential moving average of the weights."""

import torch

from nmt_cli.architecture import PRESETS
from nmt_cli.model import Transformer
from nmt_cli.trainer import WeightAverage
from nmt_cli.vocab import PAD_ID


def tiny() -> Transformer:
    torch.manual_seed(0)
    config = PRESETS["small"].replace(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    return Transformer(config, 10, 10, PAD_ID, True)


def test_average_follows_the_formula_and_swaps_in_and_out():
    model = tiny()
    average = WeightAverage(model, decay=0.9)
    start = [p.detach().clone() for p in model.parameters()]
    expected = [s.clone() for s in start]
    for step in (1, 2, 30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5)
        average.update(step)
        d = min(0.9, (1 + step) / (10 + step))  # 0.18, 0.25, then the decay itself
        expected = [d * e + (1 - d) * p.detach() for e, p in zip(expected, model.parameters())]
    assert all(torch.allclose(a, e, atol=1e-6) for a, e in zip(average.average, expected))
    own = [p.detach().clone() for p in model.parameters()]
    with average.swapped_in():
        assert all(torch.equal(p, a) for p, a in zip(model.parameters(), average.average))
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), own))
    assert len(average.state()) == len(list(model.parameters()))  # the shared embedding once
