"""The trainer's pieces: the exponential moving average of the weights, one update without host waits."""

import copy
import sys

import pytest
import torch

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.data import Batch
from nmt_cli.model.architecture import PRESETS
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import PAD_ID
from nmt_cli.train.runtime import Runtime
from nmt_cli.train.trainer import Trainer, WeightAverage


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
        average.update(step, torch.tensor(True))
        d = min(0.9, (1 + step) / (10 + step))  # 0.18, 0.25, then the decay itself
        expected = [d * e + (1 - d) * p.detach() for e, p in zip(expected, model.parameters())]
        average.update(step + 1, torch.tensor(False))  # a skipped update: the average stays
    assert all(torch.allclose(a, e, atol=1e-6) for a, e in zip(average.average, expected))
    own = [p.detach().clone() for p in model.parameters()]
    with average.swapped_in():
        assert all(torch.equal(p, a) for p, a in zip(model.parameters(), average.average))
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), own))
    assert len(average.state()) == len(list(model.parameters()))  # the shared embedding once


def tiny_trainer(device: str = "cpu", **config: float) -> Trainer:
    model = tiny().to(device)
    return Trainer(model, TrainConfig(lr=1e-2, warmup=1, lr_schedule="inverse-sqrt", **config),
                   Runtime(torch.device(device), torch.float32))


def tiny_batch(device: str = "cpu") -> Batch:
    tokens = torch.tensor([[5, 6, 7, 2], [8, 9, 2, PAD_ID]], device=device)
    return Batch(tokens, tokens, tokens)


@pytest.mark.parametrize("fused", [True, False])
def test_a_non_finite_update_is_skipped_on_the_device(fused):
    """The update returns its loss sums unread; with a non-finite loss fused Adam's found_inf leaves
    the weights, Adam's moments and step count, and the weight average as they were. An Adam that
    is not fused cannot skip on the device: the host reads the flag and skips the step itself."""
    trainer = tiny_trainer(ema_decay=0.9)
    assert trainer.skips_on_device
    if not fused:
        trainer.optimizer = torch.optim.Adam(trainer.model.parameters(), lr=0.0, foreach=False)
        trainer.skips_on_device = False
    trainer.update([tiny_batch()], 5, 1)
    def everything() -> tuple:
        return trainer.model.state_dict(), trainer.optimizer.state_dict()["state"], trainer.average.state()

    state = copy.deepcopy(everything())
    real = trainer.net.forward
    trainer.net.forward = lambda *args: tuple(x * float("nan") for x in real(*args))
    totals = trainer.update([tiny_batch()], 5, 2)
    assert totals.device.type == "cpu" and not totals[0].isfinite()
    assert_equal_trees(everything(), state)
    trainer.net.forward = real
    assert trainer.update([tiny_batch()], 5, 2)[0].isfinite()
    assert not torch.equal(trainer.model.state_dict()["output_projection.weight"],
                           state[0]["output_projection.weight"])


def assert_equal_trees(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_equal_trees(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_equal_trees(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


def test_an_update_never_waits_for_the_device(monkeypatch):
    """On the meta device any read of a value fails: an update (forward, loss, backward, clipping,
    fused Adam, weight average) that runs there queues work without ever waiting for it."""
    adam = sys.modules["torch.optim.adam"]  # meta is not among fused Adam's devices; its kernel runs there all the same
    monkeypatch.setattr(adam, "_device_dtype_check_for_fused", lambda *args, **kwargs: None)
    trainer = tiny_trainer("meta", ema_decay=0.9, clip_norm=1.0)
    assert trainer.skips_on_device and not trainer.losses.project_real_only
    totals = trainer.update([tiny_batch("meta")], 5, 1)
    assert totals.is_meta and totals.shape == (3,)
    with pytest.raises(NotImplementedError):  # what a read does there
        totals.tolist()


def test_compile_takes_the_mode_and_marks_each_update(monkeypatch):
    """--compile-mode reaches torch.compile (static shapes with buckets), and each update starts a
    new step for reduce-overhead's CUDA graphs, whose outputs the next replay may overwrite."""
    options, steps = [], []
    monkeypatch.setattr(torch, "compile", lambda net, **given: options.append(given) or net)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1))
    trainer = tiny_trainer(compile=True, compile_mode="reduce-overhead", length_buckets=2)
    assert options == [{"mode": "reduce-overhead", "dynamic": False}]
    for step in (1, 2, 3):
        trainer.update([tiny_batch()], 5, step)
    assert len(steps) == 3


def _updates_with_a_nan_on_rank_1(rank: int, init_file: str, out: str) -> None:
    """On two processes: for rank 1 counting, then standing in, an update with a NaN on rank 1
    and a finite one after it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    results = []
    for counted in ((True, True), (True, False)):
        model = tiny()
        trainer = Trainer(model, TrainConfig(lr=1e-2, warmup=1, lr_schedule="inverse-sqrt"),
                          Runtime(torch.device("cpu"), torch.float32, rank=rank, world=2))
        before = copy.deepcopy(model.state_dict())
        real = trainer.net.forward
        if rank == 1:
            trainer.net.forward = lambda *args, real=real: tuple(x * float("nan") for x in real(*args))
        totals = trainer.update([tiny_batch()], 10, 1, counted=counted[rank])
        unchanged = all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
        trainer.net.forward = real
        then = trainer.update([tiny_batch()], 10, 2, counted=counted[rank]).tolist()
        changed = not torch.equal(model.state_dict()["output_projection.weight"], before["output_projection.weight"])
        results.append({"finite": bool(totals[0].isfinite()), "unchanged": unchanged, "then": then,
                        "changed": changed})
    dist.destroy_process_group()
    torch.save(results, f"{out}.{rank}")


@pytest.mark.slow
def test_a_nan_on_one_process_skips_the_update_on_every_process(tmp_path):
    """A non-finite loss on rank 1 alone reaches every process through the summed gradients: all
    skip the step and all count the skip (their loss sums read NaN), also where rank 1 only stands
    in (an epoch's short last update, weight 0). The next update applies on all; a stand-in's
    sums count nothing."""
    import torch.multiprocessing as mp

    mp.spawn(_updates_with_a_nan_on_rank_1, args=(str(tmp_path / "init"), str(tmp_path / "out")), nprocs=2)
    ranks = [torch.load(tmp_path / f"out.{rank}") for rank in (0, 1)]
    for case, stands_in in enumerate((False, True)):
        results = [ranks[0][case], ranks[1][case]]
        assert [r["finite"] for r in results] == [False, False]
        assert [r["unchanged"] for r in results] == [True, True]
        assert [r["changed"] for r in results] == [True, True]
        assert results[0]["then"][2] == 7.0 and results[1]["then"][2] == (0.0 if stands_in else 7.0)  # targets


@pytest.mark.slow
def test_a_process_whose_peers_never_start_ends_with_a_line(monkeypatch):
    """Rank 0 of 2 whose rank 1 never comes: one line at --dist-timeout (+ its margin), no hang."""
    import time

    from conftest import free_port

    from nmt_cli.errors import NmtError
    from nmt_cli.train.runtime import set_up_runtime

    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(NmtError, match=r"^rank 0 of 2: the processes did not all start within --dist-timeout 1 s"):
        set_up_runtime(TrainConfig(device="cpu", dist_timeout=1.0))
    assert time.monotonic() - started < 10
