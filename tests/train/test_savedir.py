"""A run's checkpoints: numbered files (the weights alone, or everything with links), the newest
kept, RNG states, resume checks."""

import random

import pytest
import torch

from nmt_cli.config import TextConfig, TrainConfig
from nmt_cli.errors import NmtError
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.architecture import PRESETS
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import PAD_ID, Vocabulary
from nmt_cli.train.runtime import Runtime
from nmt_cli.train.savedir import SaveDir, rng_state, set_rng_state

VOCAB = Vocabulary(list("abcdef"))


def tiny(**overrides) -> Transformer:
    config = PRESETS["small"].replace(**{"encoder_layers": 1, "decoder_layers": 1, "d_model": 16, "d_ff": 32,
                                         "heads": 2, **overrides})
    return Transformer(config, len(VOCAB), len(VOCAB), PAD_ID, True)


CPU = Runtime(torch.device("cpu"), torch.float32)


def contents(model):
    """A checkpoint's contents: the model, and an optimizer's state as a stand-in (large in truth)."""
    return lambda: {**ckpt.describe(model, TextConfig("a", "b", tokenizer="none"), None, VOCAB, VOCAB),
                    "optimizer": {"state": torch.zeros(1000)}}


@pytest.mark.parametrize("optimizer_state", ["last", "all"])
def test_save_prunes_and_resumes_the_weights(tmp_path, optimizer_state):
    """last (the default): checkpoint_last.pt holds the optimizer's state, the numbered ones the
    weights alone (smaller; what averaging and --init-from read); all: every one holds it, the
    last a link to the newest."""
    model = tiny()
    saver = SaveDir(tmp_path, CPU, TrainConfig(keep_last=2, save_optimizer_state=optimizer_state), (VOCAB, VOCAB))
    for updates in (1, 2, 3):
        saver.save(updates, best=updates == 2, contents=contents(model))
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*.pt")) == [
        "checkpoint_2.pt", "checkpoint_3.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    newest = ckpt.load(tmp_path / "checkpoint_3.pt")
    assert (tmp_path / "checkpoint_last.pt").samefile(tmp_path / "checkpoint_3.pt") is (optimizer_state == "all")
    assert ("optimizer" in newest and "rng" in newest) is (optimizer_state == "all")
    assert all(torch.equal(newest["model"][k], v) for k, v in model.state_dict().items())
    other = tiny()
    state = saver.resume(other)
    assert len(state["rng"]) == 1 and "optimizer" in state
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    (tmp_path / "checkpoint_last.pt").unlink()
    (tmp_path / "checkpoint_last.pt").hardlink_to(tmp_path / "checkpoint_best.pt")
    if optimizer_state == "last":
        with pytest.raises(NmtError, match="checkpoint_last.pt: the weights alone, no optimizer state to resume"):
            saver.resume(tiny())


def test_resume_refuses_another_model_naming_the_field(tmp_path):
    saver = SaveDir(tmp_path, CPU, TrainConfig(keep_last=0), (VOCAB, VOCAB))
    assert saver.resume(tiny()) is None  # nothing to resume from
    saver.save(1, best=False, contents=contents(tiny()))
    with pytest.raises(NmtError, match=r"model config differs \(d_ff: 32 in the checkpoint, 64 now\)"):
        saver.resume(tiny(d_ff=64))


def test_rng_states_round_trip():
    state = rng_state()
    expected = (torch.rand(3), random.random())
    set_rng_state(state)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def _resume_in_process(rank: int, init_file: str, save_dirs: list[str], out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    runtime = Runtime(torch.device("cpu"), torch.float32, rank=rank, world=2)
    try:
        SaveDir(save_dirs[rank], runtime, TrainConfig(), (Vocabulary([]), Vocabulary([]))).resume(tiny())
        result = "resumed"
    except NmtError as e:
        result = str(e)
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


@pytest.mark.slow
def test_a_damaged_checkpoint_on_the_main_process_ends_every_process_with_its_line(tmp_path):
    """With several processes the main one reads checkpoint_last.pt for all; where it cannot, every
    process ends with the main one's line (none waits for a checkpoint that will not come), also
    one whose own save directory holds none (local to its node)."""
    import json

    import torch.multiprocessing as mp

    main, other = tmp_path / "node0", tmp_path / "node1"
    main.mkdir(), other.mkdir()
    (main / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    mp.spawn(_resume_in_process, args=(str(tmp_path / "init"), [str(main), str(other)], str(tmp_path / "out")),
             nprocs=2)
    lines = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in (0, 1)]
    assert lines[0] == lines[1] and lines[0].startswith(f"{main / 'checkpoint_last.pt'}: "), lines
