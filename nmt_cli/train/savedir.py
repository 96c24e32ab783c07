"""A training run's save directory: its numbered checkpoints (`checkpoint_N.pt`, with
checkpoint_last.pt and checkpoint_best.pt as links, the newest --keep-last kept, checkpoint_ema.pt
with --ema-decay), the RNG states they hold (so stop + resume equals one run), and what a run
starts from: the last checkpoint, checked against the model and data it would continue, or the
weights of --init-from. What a checkpoint is: checkpoint.py."""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nmt_cli.config import TextConfig, TrainConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import replacing
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.released import Released
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import Vocabulary
from nmt_cli.train.runtime import Runtime

NUMBERED = re.compile(r"checkpoint_(\d+)\.pt$")


def numbered(save_dir: Path) -> list[tuple[int, Path]]:
    """`checkpoint_N.pt` files of a save directory, by update number N."""
    found = [(int(m.group(1)), p) for p in Path(save_dir).glob("checkpoint_*.pt") if (m := NUMBERED.search(p.name))]
    return sorted(found)


def prune(save_dir: Path, keep_last: int) -> None:
    """Remove numbered checkpoints beyond the newest `keep_last`."""
    for _, path in numbered(save_dir)[:-keep_last] if keep_last > 0 else []:
        path.unlink(missing_ok=True)


def last_checkpoints(save_dir: Path, n: int) -> list[Path]:
    """The `n` numbered checkpoints of `save_dir` with the highest update numbers."""
    found = numbered(save_dir)
    if len(found) < n:
        advice = f"; --last {len(found)} averages them" if found else ""
        raise NmtError(f"{save_dir}: {len(found)} numbered checkpoint(s) found, fewer than --last {n}{advice}")
    return [path for _, path in found[-n:]]


def link(source: Path, target: Path) -> None:
    """Make `target` the same file as `source` (hard link, or copy), atomically."""
    with replacing(target, "checkpoint") as tmp:
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)


def rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


TRAINING_STATE = ("optimizer", "scaler", "ema", "rng")  # what resuming needs beyond the weights


class SaveDir:
    """The checkpoints of one training run's save directory, for a model and its vocabularies:
    checkpoint_last.pt holds what resuming needs; the numbered ones the weights alone, unless
    --save-optimizer-state all (`config`: --keep-last too)."""

    def __init__(self, save_dir: Path, runtime: Runtime, config: TrainConfig,
                 vocabularies: tuple[Vocabulary, Vocabulary]) -> None:
        self.save_dir, self.runtime, self.keep_last = Path(save_dir), runtime, config.keep_last
        self.weights_only = config.save_optimizer_state == "last"
        self.vocabularies = vocabularies
        self.last = self.save_dir / "checkpoint_last.pt"

    def resume(self, model: Transformer) -> dict[str, Any] | None:
        """checkpoint_last.pt with its weights loaded into `model`; None when there is none."""
        if self.runtime.world > 1:
            state = self._last_state()
        else:
            state = ckpt.load(self.last) if self.last.exists() else None
        if state is None:
            return None
        if "optimizer" not in state:
            raise NmtError(f"{self.last}: the weights alone, no optimizer state to resume with (a numbered "
                           "checkpoint?): fine-tune from it with --init-from, or --reset")
        ours = model.config.to_dict()
        for key, value in state["model_config"].items():
            if ours.get(key) != value:
                raise NmtError(f"{self.last}: model config differs ({key}: {value} in the checkpoint, "
                               f"{ours.get(key)} now); use the same options, --reset to start over, or "
                               "--init-from to fine-tune")
        self._check_vocabularies(state, self.last, "use the data the checkpoint was trained on, or --reset")
        model.load_state_dict(state["model"])
        return state

    def _last_state(self) -> dict[str, Any] | None:
        """With several processes: checkpoint_last.pt as the main process sees it. The others read
        the same file where they see it too (a shared save directory); where one does not (a save
        directory local to each node), the main process sends it to all."""
        state, problem = None, None
        if self.runtime.main and self.last.exists():
            try:
                state = ckpt.load(self.last)
            except NmtError as e:  # every process ends with the same line, none waits for the main one
                problem = str(e)
        info = self.last.stat() if self.last.exists() else None
        here = (info.st_size, info.st_mtime_ns) if info else None
        sent = [(here, problem)]
        dist.broadcast_object_list(sent, src=0)
        (main_file, problem), = sent
        if problem is not None:
            raise NmtError(problem)
        if main_file is None:
            return None
        elsewhere, = self.runtime.agree(here != main_file)
        if elsewhere:
            sent = [state]
            dist.broadcast_object_list(sent, src=0)
            return sent[0]
        return state if self.runtime.main else ckpt.load(self.last)

    def initialize(self, model: Transformer, path: Path, text: TextConfig, warn: Callable[[str], None]) -> Released:
        """--init-from: the weights of `path` (same vocabularies, same shapes), nothing else but
        what it keeps of its release (search settings; `nmt import`), which is returned. A model
        of other languages than the data's (`text`) is warned of."""
        state = ckpt.load(path)
        self._check_vocabularies(state, path, "--init-from needs the same vocabulary")
        own, data = (tuple(str(texts.get(key)) for key in ("source_lang", "target_lang"))
                     for texts in (state["text_config"], text.to_dict()))
        if own != data:
            warn(f"warning: {path} translates {'-'.join(own)}, the data is {'-'.join(data)}: the model "
                 "learned other languages (its subwords and vocabularies were made for them)")
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            detail = str(e).splitlines()[1].strip() if "\n" in str(e) else str(e)
            raise NmtError(f"{path}: --init-from weights do not fit this architecture ({detail})") from None
        return Released.from_dict(state.get("released"))

    def _check_vocabularies(self, state: dict[str, Any], path: Path, advice: str) -> None:
        for side, key, vocab in zip(("source", "target"), ("src_vocab", "tgt_vocab"), self.vocabularies):
            if state[key] != vocab.tokens:
                raise NmtError(f"{path}: the {side} vocabulary differs from the data directory's; {advice}")

    def save(self, updates: int, best: bool, contents: Callable[[], dict[str, Any]],
             averaged: Callable[[], dict[str, Any]] | None = None) -> None:
        """`checkpoint_{updates}.pt` holding `contents()` and every process's RNG states, then the
        links; with `averaged` (--ema-decay), also checkpoint_ema.pt holding `averaged()`, which is
        what validation measures, so checkpoint_best.pt is made from it. Every process calls it
        (the RNG states are gathered); the main one writes."""
        states = [rng_state()]
        if self.runtime.world > 1:
            states = [None] * self.runtime.world
            dist.all_gather_object(states, rng_state())
        if not self.runtime.main:
            return
        path, state = self.save_dir / f"checkpoint_{updates}.pt", {**contents(), "rng": states}
        if self.weights_only:
            ckpt.save({key: value for key, value in state.items() if key not in TRAINING_STATE}, path)
            ckpt.save(state, self.last)
        else:
            ckpt.save(state, path)
            link(path, self.last)
        if averaged is not None:
            path = self.save_dir / "checkpoint_ema.pt"
            ckpt.save(averaged(), path)
        if best:
            link(path, self.save_dir / "checkpoint_best.pt")
        prune(self.save_dir, self.keep_last)
