"""Sampling (sampling.py): reproducible, scored, independent samples; cut to the top token it is
greedy; prefixes kept. Sampling under the controls: test_controls.py."""

import pytest
from builders import greedy, prefix_tensor, random_model, seeded, sequence_log_prob, sources

from nmt_cli.config import SearchConfig
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.sampling import sample


def test_samples_are_reproducible_scored_and_independent():
    model = random_model(12, 6, scale=1.0)
    rows = [[5, 6, 7], [8, 9, 10, 11, 4, 5]]
    config = SearchConfig(sampling=True, nbest=4, beam=1, lenpen=0.0, max_len_a=0, max_len_b=10)
    first = sample(Ensemble([model]), sources(rows, 12), config, seeded(1))
    again = sample(Ensemble([model]), sources(rows, 12), config, seeded(1))
    other = sample(Ensemble([model]), sources(rows, 12), config, seeded(2))
    assert [[h.tokens for h in s] for s in first] == [[h.tokens for h in s] for s in again]
    assert [[h.tokens for h in s] for s in first] != [[h.tokens for h in s] for s in other]
    for row, samples in zip(rows, first):
        assert len(samples) == 4 and len({tuple(h.tokens) for h in samples}) > 1  # a flat model: samples differ
        assert [h.score for h in samples] == sorted((h.score for h in samples), reverse=True)
        for h in samples:
            assert h.log_prob == pytest.approx(sequence_log_prob(model, sources([row], 12), h.tokens), abs=1e-4)


@pytest.mark.parametrize("cut", [{"sampling_topk": 1}, {"sampling_topp": 1e-6}, {"temperature": 1e-4}])
def test_sampling_cut_to_the_top_token_is_greedy(cut):
    model = random_model(12, 7, scale=4.0)
    rows = [[5, 6, 7], [8, 9, 10, 11, 4, 5]]
    config = SearchConfig(sampling=True, nbest=2, max_len_a=0, max_len_b=8, **cut)
    samples = sample(Ensemble([model]), sources(rows, 12), config, seeded(0))
    for row, pair in zip(rows, samples):
        assert [h.tokens for h in pair] == [greedy(model, sources([row], 12), 8)] * 2


def test_sampling_keeps_to_prefixes():
    model = random_model(12, 8, scale=1.0)
    config = SearchConfig(sampling=True, nbest=3, max_len_a=0, max_len_b=6)
    samples = sample(Ensemble([model]), sources([[5, 6], [7]], 12), config, seeded(3),
                            prefix_tensor([[9, 10], [4]]))
    assert all(h.tokens[:2] == [9, 10] for h in samples[0]) and all(h.tokens[:1] == [4] for h in samples[1])
