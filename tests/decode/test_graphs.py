"""graphs.py: the search on fixed-shape decoders finds the hypotheses of the search on growing
caches, run eagerly (as on the CPU) and replayed as a CUDA graph would be (conftest.replayed);
on a GPU, tests/test_gpu.py replays real CUDA graphs."""

import pytest
import torch
from builders import prefix_tensor, random_model, sources
from conftest import replayed

from nmt_cli.config import SearchConfig
from nmt_cli.decode import graphs
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import beam_search


def test_the_cuda_graph_emulation_replays_operations_with_the_values_of_their_recording():
    """conftest.replayed, which tests the graphs' code on the CPU, is a replay, not a second run."""
    outside, calls = torch.zeros(3), []

    def step():
        calls.append(1)
        outside.add_(1)
        return outside * len(calls)  # a Python value: what it was at the recording

    replay = replayed(step)
    outside.fill_(10)
    assert replay().tolist() == [11.0] * 3 and outside.tolist() == [11.0] * 3 and len(calls) == 1
    for read in (lambda: outside * outside.sum().item(), lambda: outside[outside > 0], lambda: bool(outside.any())):
        with pytest.raises(AssertionError, match="reads back to the host"):
            replayed(read)


GRAPH_CASES = {  # members, beam, nbest, prefixes of the 5 sentences, model
    "beam 4, 2-best": (1, 4, 2, None, {}),
    "greedy": (1, 1, 1, None, {}),
    "beam 3, prefixes": (1, 3, 1, [[9, 9], [], [4], [5, 6, 7], []], {}),
    "ensemble": (2, 4, 1, None, {}),
    "pre-norm, learned positions": (1, 4, 1, None, {"norm": "pre", "positions": "learned"}),
}


@pytest.mark.parametrize("capture", ["eager", "replayed"])
@pytest.mark.parametrize("case", GRAPH_CASES)
@pytest.mark.slow
def test_the_search_on_fixed_shapes_finds_the_same_hypotheses(monkeypatch, capture, case):
    """Ensemble(graphs=True): the decoder on fixed-shape tensors (graphs.StaticDecoder), run as
    it is on the CPU and replayed as a CUDA graph would be (conftest.replayed), finds the
    hypotheses of the search with growing caches: as sentences leave, two batches sharing one
    decoder, and a second batch that needs another."""
    if capture == "replayed":
        monkeypatch.setattr(graphs, "capture", replayed)
    compactions = []
    reorder = graphs.StaticDecoder.reorder
    monkeypatch.setattr(graphs.StaticDecoder, "reorder",
                        lambda self, rows, sentences=None: compactions.append(sentences is not None)
                        or reorder(self, rows, sentences))
    members, beam, nbest, prefixes, variant = GRAPH_CASES[case]
    models = [random_model(15, seed, scale=3.0, **variant) for seed in range(members)]
    batches = [[[4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 4], [5, 6], [7, 7, 7, 7, 7, 7, 7, 7, 7]],
               [[8, 9], [10, 11, 12], [13], [4, 4, 4, 4], [6, 5, 4], [12, 11], [9, 9, 9, 9, 9]],
               [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 4, 5, 6, 7, 8, 9, 10]]]
    config = SearchConfig(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=4)
    graphed = Ensemble(models, graphs=True)
    for rows in batches:
        given = prefix_tensor(prefixes) if prefixes and len(rows) == len(prefixes) else None
        expected = beam_search(Ensemble(models), sources(rows, 15), config, given)
        found = beam_search(graphed, sources(rows, 15), config, given)
        assert [[h.tokens for h in hyps] for hyps in found] == [[h.tokens for h in hyps] for hyps in expected]
        assert [h.score for hyps in found for h in hyps] == pytest.approx(
            [h.score for hyps in expected for h in hyps], abs=1e-5)
    assert any(compactions)
    # 5 and 7 sentences share 8 slots; 17 source tokens need 32 keys
    assert [list(graphs.decoders) for graphs in graphed.graphs] == [[(8, beam, 16, 16), (1, beam, 32, 32)]] * members
    assert (32, 0) in graphed.graphs[0].decoders[1, beam, 32, 32].replays  # a search past its first length bucket


def test_decoders_are_kept_within_their_number_and_memory(monkeypatch):
    model = random_model(15, 0)
    graphed = Ensemble([model], graphs=True)
    (kept,) = graphed.graphs
    config = SearchConfig(beam=2, max_len_a=0, max_len_b=4)
    # (sentence slots, beam, source keys, positions): 1, 1, 4, 1, 8, 4 and 4 sentences of 4, 21, 41 tokens
    batches = [[[4] * n] * count for n, count in ((3, 1), (20, 1), (3, 3), (40, 1), (3, 5), (20, 3), (3, 4))]
    for rows in batches:
        beam_search(graphed, sources(rows, 15), config)
    assert graphs.DecoderGraphs.KEEP == 4  # the least recently used two went; (4, 2, 16, 16) was used again
    assert list(kept.decoders) == [(1, 2, 48, 16), (8, 2, 16, 16), (4, 2, 32, 16), (4, 2, 16, 16)]
    shapes = list(kept.decoders)
    buffers = [t for d in kept.decoders.values() for pair in d.memory_kv for t in pair] + [
        t for d in kept.decoders.values() for cache in d.caches for pair in cache.buffers for t in pair]
    assert sum(kept.size(s) for s in shapes) == sum(t.numel() * t.element_size() for t in buffers)
    kept.budget = kept.size(shapes[-1]) + kept.size((2, 2, 16, 16))
    beam_search(graphed, sources([[4, 5]] * 2, 15), config)
    assert list(kept.decoders) == [shapes[-1], (2, 2, 16, 16)]


def test_a_step_reads_only_its_length_bucket_of_the_caches(monkeypatch):
    """A decoder of 48 positions: a step at position t attends over the caches' first 16, 32 or 48
    positions, the first multiple of 16 above t, not over all 48; the hypotheses stay those of
    the search on growing caches (the case above, across buckets)."""
    keys_read = []  # (position, keys attended over) of each layer's step
    extend = graphs.StaticCache.extend

    def recorded(cache: graphs.StaticCache, k: torch.Tensor, v: torch.Tensor):
        out = extend(cache, k, v)
        keys_read.append((int(cache.position), out[0].size(2)))
        return out

    monkeypatch.setattr(graphs.StaticCache, "extend", recorded)
    model = random_model(15, 0, scale=3.0)
    config = SearchConfig(beam=2, min_len=40, max_len_a=0.0, max_len_b=44)
    src = sources([[4, 5, 6], [7, 8]], 15)
    graphed = Ensemble([model], graphs=True)
    found = beam_search(graphed, src, config)
    assert [[h.tokens for h in s] for s in found] == [[h.tokens for h in s] for s in
                                                      beam_search(Ensemble([model]), src, config)]
    assert [shape[-1] for shape in graphed.graphs[0].decoders] == [48]
    assert max(position for position, _ in keys_read) >= 40
    assert all(keys == min(-(-(position + 1) // 16) * 16, 48) for position, keys in keys_read)
