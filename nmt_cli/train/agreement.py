"""What the processes of a torchrun run must share, checked at the start: processes started with
other options, data or weights would train replicas that drift apart in silence, or fail later in
a collective with no cause given. Every process gathers each one's facts (options, the data
directory's pairs and files, the vocabularies, then the weights it starts from and the update it
resumes at) and, where one differs, every process ends with the same line naming it, its values
and their ranks."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.datadir import DataDir
from nmt_cli.errors import NmtError
from nmt_cli.model.architecture import ModelConfig

# Options of one process's machine that others may set otherwise without changing what is trained.
PER_PROCESS = frozenset({"device", "threads", "precision", "compile", "compile_mode", "tensorboard", "dist_timeout"})


def option_facts(model_config: ModelConfig, config: TrainConfig, reset: bool, init_from: Path | None
                 ) -> dict[str, str]:
    """The options every process must share, by flag."""
    options = {**model_config.to_dict(), **{field.name: getattr(config, field.name)
                                             for field in dataclasses.fields(config)
                                             if field.name not in PER_PROCESS}}
    facts = {f"--{name.replace('_', '-')}": str(value) for name, value in options.items()}
    return {**facts, "--reset": str(reset), "--init-from": "given" if init_from is not None else "not given"}


def data_facts(data: DataDir) -> dict[str, str]:
    """The data directory's pairs per split and its files' sha256 (the vocabularies among them)."""
    pairs = ", ".join(f"{name} {split['pairs_out']:,}" for name, split in data.meta["splits"].items())
    files = json.dumps(sorted(data.meta["checksums"].items())).encode()
    return {"the data directory's pairs": pairs,
            "the data directory's files (sha256 of their sha256s)": hashlib.sha256(files).hexdigest()[:16]}


def start_facts(model: torch.nn.Module, updates: int) -> dict[str, str]:
    """The update a process starts at and the sha256 of the weights it starts from."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return {"the update it starts at": str(updates), "the weights it starts from (sha256)": digest.hexdigest()[:16]}


def disagreement(facts: list[dict[str, str]]) -> str | None:
    """The first of what every process must share (`facts[rank]`: name -> value) on which they
    differ, as one line naming its values and their ranks; None when all agree."""
    for name in dict.fromkeys(name for theirs in facts for name in theirs):
        ranks: dict[str, list[int]] = {}
        for rank, theirs in enumerate(facts):
            ranks.setdefault(theirs.get(name, "nothing"), []).append(rank)
        if len(ranks) > 1:
            values = "; ".join(f"{value} on rank{'s' if len(held) > 1 else ''} {', '.join(map(str, held))}"
                               for value, held in ranks.items())
            return (f"the processes disagree on {name}: {values}; start every process with the same options, data "
                    "and checkpoint")
    return None


def agree(facts: dict[str, Any], world: int) -> None:
    """Every process's `facts` gathered (a collective every process makes); where they differ,
    every process ends with the same line (`disagreement`)."""
    if world == 1:
        return
    every: list[dict[str, str]] = [{}] * world
    dist.all_gather_object(every, facts)
    if (line := disagreement(every)) is not None:
        raise NmtError(line)
