"""On a CUDA GPU: resume in bf16, a GPU checkpoint on a CPU; the
search's results and its reads back to the host.

Skipped where there is no CUDA device (the CPU paths are covered by train/test_run.py).
"""

import json
import signal
import warnings

import pytest
import torch
from builders import LEARNER, LEARNER_RECIPE, random_model, run_training, sources
from builders import TRAIN_TINY as TINY
from click.testing import CliRunner
from conftest import request, serving, synthetic_data_dir

from nmt_cli.cli import main
from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import beam_search
from nmt_cli.decode.translate import translate_lines
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model import kernels
from nmt_cli.run_config import RunConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_resume_on_the_gpu_continues_where_it_stopped(tmp_path):
    data = synthetic_data_dir(tmp_path)
    options = {"device": "cuda", "precision": "bf16", **LEARNER_RECIPE}
    run_training(data, tmp_path / "straight", LEARNER, max_updates=20, **options).run()
    run_training(data, tmp_path / "resumed", LEARNER, max_updates=10, **options).run()
    resumed = run_training(data, tmp_path / "resumed", LEARNER, max_updates=20, **options)
    assert resumed.resumed and resumed.progress.updates == 10
    resumed.run()
    straight, again = (ckpt.load(tmp_path / f"{name}/checkpoint_last.pt") for name in ("straight", "resumed"))
    assert again["progress"]["updates"] == straight["progress"]["updates"] == 20
    for key, value in straight["model"].items():  # same batches, same RNG: the same run up to GPU rounding
        torch.testing.assert_close(again["model"][key], value, rtol=2e-2, atol=2e-3)


def test_a_checkpoint_trained_on_the_gpu_translates_on_the_cpu(tmp_path):
    run_training(synthetic_data_dir(tmp_path), tmp_path / "ck", TINY, device="cuda", max_updates=5).run()
    bundle = ckpt.load_bundle(tmp_path / "ck/checkpoint_last.pt")
    assert all(p.device.type == "cpu" for p in bundle.model.parameters())
    engine = Engine([bundle], RunConfig(SearchConfig(beam=2)), torch.device("cpu"))
    assert len(translate_lines(engine, ["a b c", "d e"])) == 2


def test_training_on_the_gpu_prefetches_batches_into_page_locked_memory(tmp_path):
    run = run_training(synthetic_data_dir(tmp_path), tmp_path / "ck", TINY, device="cuda")
    assert run.prefetcher.background
    order = run.batches[:2]
    run.prefetcher.prefetch([order[1]])
    (batch,) = run.prefetcher.get([order[1]])
    assert batch.src.is_pinned() and torch.equal(batch.src, run.train.collate(order[1], 8).src)
    run.prefetcher.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_search_on_the_gpu_finds_the_cpus_hypotheses_and_rarely_waits(dtype):
    """The host waits for the GPU at a read of which sentences are done (every
    device.steps_between_reads steps, and the batch's index after it), at the start and for the
    results, never at every step."""
    model = random_model(40, 3, scale=3.0)
    rows = [[4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 4], [5, 6], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]]
    config = SearchConfig(beam=4, nbest=2, max_len_a=3.0, max_len_b=20)
    on_cpu = beam_search(Ensemble([model]), sources(rows, 40), config)
    models = Ensemble([random_model(40, 3, scale=3.0).to("cuda", dtype)])
    steps = []
    top_tokens = models.top_tokens
    models.top_tokens = lambda *args, **kw: steps.append(1) or top_tokens(*args, **kw)
    src = sources(rows, 40).cuda()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            on_gpu = beam_search(models, src, config)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = sum("synchroniz" in str(w.message) for w in caught)
    assert len(steps) >= 24 and waits <= 2 * (len(steps) // 8 + 1) + 8
    if dtype == torch.float32:
        assert [[h.tokens for h in s] for s in on_gpu] == [[h.tokens for h in s] for s in on_cpu]
    else:
        assert [s[0].tokens for s in on_gpu] == [s[0].tokens for s in on_cpu]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_search_replayed_as_cuda_graphs_finds_the_eager_hypotheses(dtype):
    """Ensemble(graphs=True) captures the decoder's steps as CUDA graphs and replays them: the
    hypotheses of the eager search on the same GPU, batch after batch."""
    model = kernels.use_fast_paths(random_model(40, 3, scale=3.0)).to("cuda", dtype)  # as nmt translate runs it
    config = SearchConfig(beam=4, nbest=2, max_len_a=3.0, max_len_b=20)
    graphed = Ensemble([model], graphs=True)
    batches = [[[4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 4], [5, 6], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]],
               [[8, 9], [10, 11, 12], [13], [4, 4, 4, 4], [6, 5, 4], [12, 11], [9, 9, 9, 9, 9]]]
    for rows in batches:
        src = sources(rows, 40).cuda()
        eager, found = (beam_search(models, src, config) for models in (Ensemble([model]), graphed))
        if dtype == torch.float32:
            assert [[h.tokens for h in s] for s in found] == [[h.tokens for h in s] for s in eager]
            assert [h.score for s in found for h in s] == pytest.approx([h.score for s in eager for h in s], abs=1e-4)
        else:  # the padded keys change bf16 roundings: the best hypotheses agree
            assert sum(a[0].tokens == b[0].tokens for a, b in zip(found, eager)) >= len(rows) - 1
    replays = [replay for decoder in graphed.graphs[0].decoders.values() for replay in decoder.replays.values()]
    assert replays and all(replay.__name__ == "replay" for replay in replays)  # captured, not run eagerly
    lengths = {length for decoder in graphed.graphs[0].decoders.values() for length, _ in decoder.replays}
    assert len(lengths) > 1  # graphs of several length buckets, captured as the search reached them


def test_graphs_are_captured_again_after_earlier_ones_are_gone():
    """Once all graphs of a memory pool are gone torch releases the pool, and capturing into it
    again fails: a search with graphs after another's were dropped (release_graphs, as the
    out-of-memory halving does) or garbage-collected (a second Translator in one process)."""
    model = kernels.use_fast_paths(random_model(40, 3, scale=3.0)).to("cuda")
    config = SearchConfig(beam=4, max_len_a=1.0, max_len_b=5)
    src = sources([[4, 5, 6], [7, 8]], 40).cuda()
    expected = beam_search(Ensemble([model]), src, config)
    for _ in range(2):
        graphed = Ensemble([model], graphs=True)
        assert [s[0].tokens for s in beam_search(graphed, src, config)] == [s[0].tokens for s in expected]
        graphed.release_graphs()
        assert [s[0].tokens for s in beam_search(graphed, src, config)] == [s[0].tokens for s in expected]
        del graphed


def translate_cli(model, lines, *options):
    result = CliRunner().invoke(main, ["translate", "-m", str(model), *map(str, options)],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def copier(tmp_path):
    """A small model trained on the CPU to copy its input, sure of its outputs (on the CPU its
    bf16 translations of the validation lines equal the fp32 ones); and those lines."""
    data = synthetic_data_dir(tmp_path, n_train=1000, task="copy")
    run_training(data, tmp_path / "ck", LEARNER, max_updates=300, **LEARNER_RECIPE).run()
    return tmp_path / "ck/checkpoint_last.pt", (tmp_path / "raw/valid.src").read_text().splitlines()


def test_translate_on_the_gpu_with_every_search_option(tmp_path):
    """`nmt translate --device cuda` (bf16 by --precision auto) gives the CPU's translations and
    scores, n-best lists, ensembles, the same translations with --cuda-graphs, attention weights,
    reproducible samples, and outputs that start with their prefixes."""
    model, lines = copier(tmp_path)
    on = {device: translate_cli(model, lines, "--device", device) for device in ("cuda", "cpu")}
    assert sum(a == b for a, b in zip(on["cuda"], on["cpu"])) >= 0.9 * len(lines)
    nbest = {device: [json.loads(r) for r in translate_cli(model, lines, "--device", device, "--format", "jsonl",
                                                             "--nbest", 2)] for device in ("cuda", "cpu")}
    for gpu, cpu in zip(nbest["cuda"], nbest["cpu"]):
        assert len(gpu["nbest"]) == 2
        if gpu["translation"] == cpu["translation"]:
            assert gpu["nbest"][0]["log_prob"] == pytest.approx(cpu["nbest"][0]["log_prob"], abs=0.1)
    sampled = [translate_cli(model, lines, "--device", "cuda", "--sampling", "--seed", 1, "--nbest", 3,
                             "--format", "jsonl") for _ in range(2)]
    assert sampled[0] == sampled[1] and all(len(json.loads(r)["nbest"]) == 3 for r in sampled[0])
    twice = translate_cli(model, lines, "-m", model, "--device", "cuda")  # an ensemble of the model with itself
    assert sum(a == b for a, b in zip(twice, on["cuda"])) >= 0.9 * len(lines)
    graphed = translate_cli(model, lines, "--device", "cuda", "--cuda-graphs")
    assert sum(a == b for a, b in zip(graphed, on["cuda"])) >= 0.9 * len(lines)
    attention = [json.loads(r)["attention"] for r in translate_cli(model, lines[:3], "--device", "cuda", "--format",
                                                                    "jsonl", "--attention")]
    assert all(sum(row) == pytest.approx(1.0, abs=1e-2) for a in attention for row in a["weights"])
    starts = [line.split()[-1] for line in lines]  # not where a copy starts
    prefixed = translate_cli(model, [f"{line}\t{start}" for line, start in zip(lines, starts)], "--device", "cuda",
                             "--prefix")
    assert all(out.split()[0] == start for out, start in zip(prefixed, starts))


def test_serve_on_the_gpu_answers_as_the_cpu_translates(tmp_path):
    model, lines = copier(tmp_path)
    _, url, process = serving(tmp_path, model=model, device="cuda")
    try:
        status, answer = request(url + "/translate", {"text": lines, "beam": 4})
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert status == 200
    cpu = translate_cli(model, lines, "--device", "cpu")
    assert sum(a == b for a, b in zip(answer["translations"], cpu)) >= 0.9 * len(lines)


def test_start_from_a_released_model_on_the_gpu(tmp_path, multi30k):
    """The README's "Start from a released model" commands (test_readme.py) where device auto is the GPU."""
    from test_readme import test_start_from_a_released_model_runs_as_written

    test_start_from_a_released_model_runs_as_written(tmp_path, multi30k)
