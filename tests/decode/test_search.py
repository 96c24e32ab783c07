"""Beam search: formulas, greedy, exhaustive optimality, batching, ensembles."""

import itertools

import pytest
import torch
from builders import (
    greedy,
    prefix_tensor,
    random_model,
    reference_beam_search,
    seeded,
    sequence_log_prob,
    sources,
)

from nmt_cli.config import SearchConfig
from nmt_cli.decode import ensemble, sampling, search
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import beam_search, length_penalty, max_lengths
from nmt_cli.model import kernels
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def test_length_penalty_values():
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)
    assert length_penalty(10, 0.0) == 1.0
    assert length_penalty(7, 0.6, "length") == pytest.approx(7 ** 0.6)
    assert length_penalty(7, 1.0, "length") == 7


def test_max_length_is_a_times_source_plus_b():
    config = SearchConfig(max_len_a=1.0, max_len_b=50)
    assert max_lengths(torch.tensor([3, 10]), config, 1024).tolist() == [53, 60]
    assert max_lengths(torch.tensor([3]), SearchConfig(max_len_a=2, max_len_b=5), 1024).tolist() == [11]
    assert max_lengths(torch.tensor([3000]), config, 1024).tolist() == [1023]  # within the positions
    huge = SearchConfig(max_len_a=1e308, max_len_b=2**31 - 1)  # bounded before they become integers
    assert max_lengths(torch.tensor([3, 0]), huge, 1024).tolist() == [1023, 1023]
    assert max_lengths(torch.tensor([3, 100]), SearchConfig(max_len=20), 1024).tolist() == [20, 20]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_1_is_greedy(seed):
    model = random_model(12, seed, scale=4.0)
    rows = [[5, 6, 7], [8, 9, 10, 11, 4, 5]]
    config = SearchConfig(beam=1, lenpen=0.6, max_len_a=0, max_len_b=8)
    hyps = beam_search(Ensemble([model]), sources(rows, 12), config)
    for row, h in zip(rows, hyps):
        assert h[0].tokens == greedy(model, sources([row], 12), 8)


@pytest.mark.parametrize("form", ["gnmt", "length"])
@pytest.mark.parametrize("lenpen", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.slow
def test_wide_beam_equals_exhaustive_search(lenpen, seed, form):
    vocab, limit = 7, 3  # symbols 4, 5, 6 (and EOS); outputs of up to 3 symbols
    model = random_model(vocab, seed, scale=3.0)
    src = sources([[4, 5, 6, 5]], vocab)
    config = SearchConfig(beam=200, lenpen=lenpen, lenpen_form=form, max_len_a=0, max_len_b=limit, nbest=3)
    found = beam_search(Ensemble([model]), src, config)[0]
    every = [list(seq) for n in range(limit + 1) for seq in itertools.product([4, 5, 6], repeat=n)]
    scored = sorted(((sequence_log_prob(model, src, seq) / length_penalty(len(seq) + 1, lenpen, form), seq)
                     for seq in every), key=lambda x: -x[0])
    assert [h.tokens for h in found] == [seq for _, seq in scored[:3]]
    for h, (score, _) in zip(found, scored):
        assert h.score == pytest.approx(score, abs=1e-4)


def test_narrow_beam_scores_are_the_models_penalized_log_probabilities():
    model = random_model(9, 5, scale=3.0)
    src = sources([[4, 5, 6]], 9)
    h = beam_search(Ensemble([model]), src, SearchConfig(beam=2, max_len_a=0, max_len_b=4))[0][0]
    assert h.score == pytest.approx(sequence_log_prob(model, src, h.tokens) / length_penalty(len(h.tokens) + 1, 0.6),
                                    abs=1e-4)


@pytest.mark.parametrize("rules", [{}, {"lenpen_form": "length", "lenpen": 1.0, "stopping": "heuristic"},
                                   {"stopping": "heuristic", "lenpen": 2.0},
                                   {"lenpen_form": "length", "lenpen": 1.0, "lenpen_start": True, "stopping": "onmt",
                                    "at_limit": "cut"},
                                   {"at_limit": "free", "stopping": "heuristic"}, {"at_limit": "cut", "lenpen": 1.0},
                                   {"min_len": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.5},
                                   {"no_repeat_ngram_size": 1, "repetition_penalty": 0.7, "stopping": "heuristic"}])
@pytest.mark.parametrize("beam, vocab, seed", [(2, 9, 0), (4, 12, 1), (4, 12, 2), (5, 6, 3), (8, 6, 4), (4, 601, 5)])
@pytest.mark.slow
def test_search_equals_the_search_written_out(beam, vocab, seed, rules):
    """Also where the first step cannot fill a beam from one row (vocabulary below the beam), and
    with a vocabulary wide enough for top-k through chunk maxima (601 = 8 x 75 + 1); with either
    length penalty and either stopping rule."""
    model = random_model(vocab, seed, scale=2.0)
    rows = [[4, 5, 4], [5], [4, 4, 5, 5, 4]]
    config = SearchConfig(beam=beam, nbest=2, max_len_a=0.5, max_len_b=3, **rules)
    batched = beam_search(Ensemble([model]), sources(rows, vocab), config)
    for row, hyps in zip(rows, batched):
        expected = reference_beam_search(model, sources([row], vocab), config)
        assert [h.tokens for h in hyps] == [tokens for _, _, tokens in expected]
        assert [h.score for h in hyps] == pytest.approx([score for score, _, _ in expected], abs=1e-4)


@pytest.mark.parametrize("beam, seed, members, rules", [
    (2, 0, 1, {}), (4, 1, 1, {"min_len": 2, "no_repeat_ngram_size": 2, "repetition_penalty": 1.5}),
    (4, 2, 2, {"stopping": "heuristic", "lenpen": 1.5}), (5, 3, 1, {"nbest": 3}),
    (4, 4, 1, {"stopping": "onmt", "at_limit": "cut"}), (3, 5, 1, {"at_limit": "free"})])
def test_a_shortlisted_search_is_the_search_written_out_over_its_columns(beam, seed, members, rules):
    """A shortlist's columns: each model's softmax over them alone (averaged in an ensemble), and
    no other token output; the controls as they are over the whole vocabulary."""
    import random

    models = [random_model(40, seed + 10 * m, scale=2.0) for m in range(members)]
    columns = sorted({PAD_ID, BOS_ID, EOS_ID, UNK_ID, *random.Random(seed).sample(range(4, 40), 12)})
    rows = [[4, 5, 4], [5], [4, 4, 5, 5, 4]]
    config = SearchConfig(beam=beam, max_len_a=0.5, max_len_b=4, **{"nbest": 2, **rules})
    batched = beam_search(Ensemble(models), sources(rows, 40), config, columns=torch.tensor(columns))
    for row, hyps in zip(rows, batched):
        expected = reference_beam_search(models, sources([row], 40), config, columns)
        assert [h.tokens for h in hyps] == [tokens for _, _, tokens in expected]
        assert [h.score for h in hyps] == pytest.approx([score for score, _, _ in expected], abs=1e-4)
        assert set(itertools.chain(*(h.tokens for h in hyps))) <= set(columns)
    whole = torch.arange(40)
    for config in (SearchConfig(beam=beam), SearchConfig(beam=1)):  # the whole vocabulary: the search itself
        unlisted = beam_search(Ensemble(models), sources(rows, 40), config)
        assert beam_search(Ensemble(models), sources(rows, 40), config, columns=whole) == unlisted


def test_sampling_draws_only_a_shortlists_tokens():
    model = random_model(40, 7, scale=0.5)  # flat: every token likely
    columns = torch.tensor([PAD_ID, BOS_ID, EOS_ID, UNK_ID, 6, 9, 13, 21, 30])
    config = SearchConfig(sampling=True, nbest=8, max_len_b=6, max_len_a=0.0, seed=3)
    drawn = sampling.sample(Ensemble([model]), sources([[4, 5], [6]], 40), config, seeded(3), columns=columns)
    tokens = {t for hyps in drawn for h in hyps for t in h.tokens}
    assert tokens <= set(columns.tolist()) and len(tokens) > 3
    assert drawn == sampling.sample(Ensemble([model]), sources([[4, 5], [6]], 40), config, seeded(3),
                                    columns=columns)


def test_batched_equals_one_by_one():
    model = random_model(15, 1, scale=3.0)
    rows = [[4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 4], [5, 6], [7, 7, 7, 7, 7, 7, 7, 7, 7]]
    config = SearchConfig(beam=4, max_len_a=1.0, max_len_b=3)
    batched = beam_search(Ensemble([model]), sources(rows, 15), config)
    for row, hyps in zip(rows, batched):
        alone = beam_search(Ensemble([model]), sources([row], 15), config)[0]
        assert hyps[0].tokens == alone[0].tokens
        assert hyps[0].score == pytest.approx(alone[0].score, abs=1e-4)


@pytest.mark.parametrize("members", [1, 2])
def test_blocks_of_rows_give_the_same_search(monkeypatch, members):
    models = Ensemble([random_model(15, seed, scale=3.0) for seed in range(members)])
    src = sources([[4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 4], [5, 6]], 15)
    config = SearchConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=2)
    whole = beam_search(models, src, config)
    monkeypatch.setattr(ensemble, "block_floats", lambda device: 15 * 5)  # blocks of 5 rows: 12 = 5 + 5 + 2
    blocks = beam_search(models, src, config)
    assert [[h.tokens for h in hyps] for hyps in whole] == [[h.tokens for h in hyps] for hyps in blocks]
    assert [h.score for hyps in whole for h in hyps] == pytest.approx([h.score for hyps in blocks for h in hyps])


def test_ensemble_of_a_model_with_itself_is_the_model():
    model = random_model(15, 2, scale=3.0)
    src = sources([[4, 5, 6, 7], [8, 9]], 15)
    config = SearchConfig(beam=3, nbest=2, max_len_a=1, max_len_b=4)
    one = beam_search(Ensemble([model]), src, config)
    two = beam_search(Ensemble([model, model]), src, config)
    for a, b in zip(one, two):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("rules", [{}, {"lenpen_form": "length", "lenpen": 1.0, "stopping": "heuristic"}])
@pytest.mark.parametrize("beam", [1, 3])
def test_an_ensemble_of_two_models_searches_their_averaged_probabilities(beam, rules):
    a, b = random_model(12, 2, scale=3.0), random_model(12, 9, scale=3.0)
    config = SearchConfig(beam=beam, nbest=beam, max_len_a=1, max_len_b=4, **rules)
    for row in ([4, 5, 6, 7], [8, 9, 10], [11]):
        found = beam_search(Ensemble([a, b]), sources([row], 12), config)[0]
        expected = reference_beam_search([a, b], sources([row], 12), config)
        assert [h.tokens for h in found] == [tokens for _, _, tokens in expected]
        assert [h.score for h in found] == pytest.approx([score for score, _, _ in expected], abs=1e-4)


def test_ensemble_differs_from_its_members():
    a, b = random_model(15, 2, scale=3.0), random_model(15, 9, scale=3.0)
    src = sources([[4, 5, 6, 7]], 15)
    config = SearchConfig(beam=2, max_len_a=1, max_len_b=4)
    ensemble = beam_search(Ensemble([a, b]), src, config)[0][0].score
    assert ensemble != pytest.approx(beam_search(Ensemble([a]), src, config)[0][0].score, abs=1e-4)


def test_unknown_token_only_when_allowed(monkeypatch):
    model = random_model(8, 0)
    bias = torch.zeros(8)
    bias[UNK_ID] = 20.0  # make <unk> by far the likeliest token
    monkeypatch.setattr(ensemble, "search_projection", lambda m: lambda x: m.output_projection(x) + bias)
    src = sources([[4, 5, 6, 7]], 8)
    config = SearchConfig(beam=2, max_len_a=0, max_len_b=5)
    assert UNK_ID not in beam_search(Ensemble([model]), src, config)[0][0].tokens
    allowed = SearchConfig(beam=2, max_len_a=0, max_len_b=5, allow_unk=True)
    assert UNK_ID in beam_search(Ensemble([model]), src, allowed)[0][0].tokens


def test_vocabulary_fillers_are_never_output(monkeypatch):
    model, fillers = random_model(12, 0), [10, 11]
    bias = torch.zeros(12)
    bias[fillers] = 20.0  # the fillers (never seen in training) by far the likeliest tokens
    monkeypatch.setattr(ensemble, "search_projection", lambda m: lambda x: m.output_projection(x) + bias)
    src, prefixes = sources([[4, 5, 6, 7], [8, 9]], 12), prefix_tensor([[5], []])
    beam, sampled = SearchConfig(beam=3, nbest=2, max_len_b=5), SearchConfig(sampling=True, nbest=4, max_len_b=5)

    def outputs(ensemble):
        found = beam_search(ensemble, src, beam) + beam_search(ensemble, src, beam, prefixes)
        found += sampling.sample(ensemble, src, sampled, seeded(0)) + sampling.sample(ensemble, src, sampled, seeded(1),
                                                                                  prefixes)
        return {token for hyps in found for h in hyps for token in h.tokens}

    assert set(fillers) <= outputs(Ensemble([model]))  # they would be chosen
    assert not set(fillers) & outputs(Ensemble([model], never=fillers))


@pytest.mark.parametrize("variant", [{}, {"output_bias": True}, {"tied_output": False, "output_bias": True}])
def test_packed_projection_matches_the_model_and_leaves_it_alone(variant):
    model = random_model(50, 3, scale=4.0, **variant)
    if model.output_projection.bias is not None:
        torch.nn.init.normal_(model.output_projection.bias)
    ensemble = Ensemble([model])
    if torch.backends.mkldnn.is_available():  # x86 builds of PyTorch (this project's CI) have oneDNN
        assert isinstance(ensemble.projections[0], kernels.PackedProjection)
    assert type(model.output_projection) is torch.nn.Linear  # the model is not changed
    x = torch.randn(37, 32)
    with torch.inference_mode():
        assert torch.allclose(ensemble.projections[0](x), model.output_projection(x), atol=1e-5)


def test_search_falls_back_to_the_model_projection_where_it_cannot_pack(monkeypatch):
    model = random_model(50, 4, scale=4.0)
    src = sources([[5, 6, 7], [8, 9, 10, 11, 12]], 50)
    config = SearchConfig(beam=3, max_len_a=0, max_len_b=8)
    packed = beam_search(Ensemble([model]), src, config)

    def unavailable(weight, bias):
        raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_reorder_linear_weight'")

    monkeypatch.setattr(kernels, "PackedProjection", unavailable)
    ensemble = Ensemble([model])
    assert ensemble.projections[0] is model.output_projection
    plain = beam_search(ensemble, src, config)
    assert [[h.tokens for h in hyps] for hyps in plain] == [[h.tokens for h in hyps] for hyps in packed]
    assert [hyps[0].score for hyps in plain] == pytest.approx([hyps[0].score for hyps in packed], abs=1e-4)
    attempts: list = []
    monkeypatch.setattr(kernels, "PackedProjection", lambda *args: attempts.append(args))
    bf16 = random_model(50, 4).to(torch.bfloat16)
    assert Ensemble([bf16]).projections[0] is bf16.output_projection and not attempts  # not even tried off float32


@pytest.mark.parametrize("beam", [1, 3])
def test_forced_prefixes_start_every_output_and_score_like_the_model(beam):
    model = random_model(12, 4, scale=4.0)
    rows = [[5, 6, 7], [8, 9, 10, 11, 4, 5], [6, 4]]
    prefixes = [[9, UNK_ID, 9], [], [4]]  # <unk> is never chosen, but a prefix may hold it
    config = SearchConfig(beam=beam, lenpen=0.0, max_len_a=0, max_len_b=6)
    hyps = beam_search(Ensemble([model]), sources(rows, 12), config, prefix_tensor(prefixes))
    for row, prefix, h in zip(rows, prefixes, hyps):
        assert h[0].tokens[:len(prefix)] == prefix
        assert h[0].log_prob == pytest.approx(sequence_log_prob(model, sources([row], 12), h[0].tokens), abs=1e-4)
    free = beam_search(Ensemble([model]), sources(rows[1:2], 12), config)
    assert hyps[1][0].tokens == free[0][0].tokens  # an empty prefix forces nothing


def test_a_prefix_longer_than_the_length_limit_still_ends_in_a_token_after_it():
    model = random_model(12, 5, scale=4.0)
    config = SearchConfig(beam=2, max_len_a=0, max_len_b=2)
    hyps = beam_search(Ensemble([model]), sources([[5, 6]], 12), config, prefix_tensor([[7, 8, 9, 10]]))
    assert hyps[0][0].tokens[:4] == [7, 8, 9, 10] and len(hyps[0][0].tokens) <= 5


SYNCING_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
               torch.ops.aten.is_nonzero.default, torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default}


def steps_and_reads(monkeypatch, models, run):
    """The events of `run()`, in order: "step" for each step of the search (a call of
    `models.top_tokens`), "read" for each read back to the host (tolist, item, bool, nonzero,
    boolean indexing) and each `x[index] = 0.5` (on a GPU, torch makes the value in host memory
    and copies it), the calls that make the host wait for a GPU. (Filling a slice, `x[:, 0] = 0.5`,
    copies nothing.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    events, from_python = [], {}  # id: tensor, held so that no other tensor takes its id

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            masks = func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool
                                                                for i in args[1])
            copied = func in (torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default) \
                and id(args[2]) in from_python
            if func in SYNCING_OPS or masks or copied:
                events.append("read")
            result = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.lift_fresh.default:
                from_python[id(result)] = result
            return result

    tolist, top_tokens = torch.Tensor.tolist, models.top_tokens
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: events.append("read") or tolist(self))
    monkeypatch.setattr(models, "top_tokens", lambda *args, **kw: events.append("step") or top_tokens(*args, **kw))
    with Reads():
        result = run()
    monkeypatch.undo()
    return result, events


def reads_after_each_step(events):
    """How many reads follow each step before the next one (not the last step: the results' transfer)."""
    counts = []
    for event in events[events.index("step"):]:
        if event == "step":
            counts.append(0)
        else:
            counts[-1] += 1
    return counts[:-1]


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("sampled", [False, True])
def test_the_host_reads_the_search_state_only_every_few_steps(monkeypatch, every, sampled):
    """A step's bookkeeping stays on the device: the host reads which sentences are done once
    every `steps_between_reads` steps (a GPU waits at each read), and the search is the same."""
    models = Ensemble([random_model(12, 9, scale=2.0)])
    rows = [[5, 6, 7], [8, 9, 10, 11, 4, 5], [6], [7, 8, 9, 10, 11, 4, 5, 6, 7]]
    config = SearchConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=4, sampling=sampled, temperature=2.0)
    prefixes = prefix_tensor([[9], [], [4, 5], []])

    def run():
        if sampled:
            return sampling.sample(models, sources(rows, 12), config, seeded(4), prefixes)
        return beam_search(models, sources(rows, 12), config, prefixes)

    expected = run()
    for module in (search, sampling):
        monkeypatch.setattr(module, "steps_between_reads", lambda device: every)
    hyps, events = steps_and_reads(monkeypatch, models, run)
    reads = reads_after_each_step(events)
    assert len(reads) >= 2 * every
    assert reads == [int((step + 1) % every == 0) for step in range(len(reads))]
    assert [[h.tokens for h in s] for s in hyps] == [[h.tokens for h in s] for s in expected]
    assert [h.score for s in hyps for h in s] == pytest.approx([h.score for s in expected for h in s], abs=1e-5)
    assert all(len(s) == 2 for s in hyps)


def test_a_bf16_model_finds_the_fp32_hypotheses():
    """`--precision bf16` casts the weights (no autocast per step); the log-probabilities and the
    scores stay float32. On sharp distributions the search finds the same outputs."""
    model = random_model(15, 1, scale=4.0)
    src = sources([[4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 4], [5, 6]], 15)
    config = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=3)
    fp32 = beam_search(Ensemble([model]), src, config)
    bf16 = beam_search(Ensemble([random_model(15, 1, scale=4.0).to(torch.bfloat16)]), src, config)
    assert [s[0].tokens for s in bf16] == [s[0].tokens for s in fp32]
    # bf16 keeps 8 bits of mantissa: logits of size ~10 carry errors of a few hundredths each
    assert [s[0].log_prob for s in bf16] == pytest.approx([s[0].log_prob for s in fp32], rel=0.03)
    assert [s[0].log_prob for s in bf16] != [s[0].log_prob for s in fp32]  # it did compute in bf16
