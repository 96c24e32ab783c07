"""Checkpoint averaging (§6.1: "the model obtained by averaging the last 5 checkpoints"): the
parameters of several checkpoints of one model, averaged in fp64 and stored in their dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt_cli.errors import NmtError
from nmt_cli.model.checkpoint import DESCRIPTION, load


def average(paths: list[Path]) -> dict[str, Any]:
    """Parameter average of checkpoints of one model (§6.1), in fp32, without optimizer state.

    Floating-point tensors are averaged; integer tensors must be equal. The result keeps the first
    checkpoint's description (config, vocabularies, BPE codes, tokenizer) and lists its inputs.
    """
    if not paths:
        raise NmtError("no checkpoints to average")
    first = load(paths[0])
    keys = DESCRIPTION[2:]  # all but the versions
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    updates = [first.get("progress", {}).get("updates")]
    for path in paths[1:]:
        other = load(path)
        for key in keys:
            if other.get(key) != first.get(key):
                detail = _first_difference(first[key], other[key]) if isinstance(first.get(key), dict) else key
                raise NmtError(f"{paths[0]} and {path} differ in {detail}: they are not the same model")
        for name, tensor in other["model"].items():
            if tensor.is_floating_point():
                total[name] += tensor.double()
            elif not torch.equal(tensor, total[name]):
                raise NmtError(f"{paths[0]} and {path}: integer tensor {name} differs")
        updates.append(other.get("progress", {}).get("updates"))
    averaged = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v
                for k, v in total.items()}
    result = {key: first.get(key) for key in ("format_version", "nmt_cli_version", *keys)}
    if "data" in first:  # what the model was trained on (kept, not compared)
        result["data"] = first["data"]
    result["model"] = averaged
    result["averaged_from"] = [{"path": str(p), "updates": u} for p, u in zip(paths, updates)]
    return result


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    for key in [*a, *(k for k in b if k not in a)]:  # in the config's own order
        if a.get(key) != b.get(key):
            return f"{key} ({a.get(key)} vs {b.get(key)})"
    return "nothing"
