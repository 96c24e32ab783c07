"""Self-describing checkpoints, written atomically and read without running foreign code.

A checkpoint is a dict of plain types and tensors only, so `torch.load(weights_only=True)` reads
it: the model and training configs, the tokenizer settings, the BPE codes, the vocabularies, the
parameters, and (for training checkpoints) optimizer, scaler, progress and RNG states. With it,
`nmt translate -m CKPT` needs nothing else.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from nmt_cli import NmtError, __version__
from nmt_cli.architecture import ModelConfig
from nmt_cli.config import TextConfig
from nmt_cli.files import reason, replacing
from nmt_cli.model import Transformer
from nmt_cli.vocab import PAD_ID, SPECIALS, Vocabulary

FORMAT_VERSION = 1
NUMBERED = re.compile(r"checkpoint_(\d+)\.pt$")


@dataclass
class ModelBundle:
    """Everything needed to use a trained model: the network and its text pipeline."""

    model: Transformer
    text: TextConfig
    bpe_codes: str | None
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    sentencepiece: bytes | None = None

    def describe(self) -> dict[str, Any]:
        return describe(self.model, self.text, self.bpe_codes, self.src_vocab, self.tgt_vocab, self.sentencepiece)


# What `describe` writes beside the weights ("model"): all a model file needs to be used (`nmt export`
# keeps these in a safetensors file's metadata).
DESCRIPTION = ("format_version", "nmt_cli_version", "model_config", "text_config", "bpe_codes", "sentencepiece",
               "src_vocab", "tgt_vocab", "shared_vocab")


def describe(model: Transformer, text: TextConfig, bpe_codes: str | None, src_vocab: Vocabulary,
             tgt_vocab: Vocabulary, sentencepiece: bytes | None = None) -> dict[str, Any]:
    """The self-describing part of every checkpoint: the DESCRIPTION fields and the weights."""
    return {
        "format_version": FORMAT_VERSION,
        "nmt_cli_version": __version__,
        "model_config": model.config.to_dict(),
        "text_config": text.to_dict(),
        "bpe_codes": bpe_codes,
        "sentencepiece": sentencepiece,
        "src_vocab": src_vocab.tokens,
        "tgt_vocab": tgt_vocab.tokens,
        "shared_vocab": model.src_embed.tokens is model.tgt_embed.tokens,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }


def save(checkpoint: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    with replacing(path, "checkpoint") as tmp, open(tmp, "wb") as f:
        writer = _Recording(f)
        try:
            torch.save(checkpoint, writer)
            f.flush()
            os.fsync(f.fileno())
        except (OSError, RuntimeError) as e:  # torch's zip writer hides a failed write's OSError behind its own
            error = e if isinstance(e, OSError) else writer.error
            if error is None:
                raise
            raise NmtError(f"{path}: cannot write checkpoint ({reason(error)}); earlier checkpoints are "
                           "intact") from None


class _Recording:
    """A file object that remembers the OSError its write raised."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def link(source: Path, target: Path) -> None:
    """Make `target` the same file as `source` (hard link, or copy), atomically."""
    with replacing(target, "checkpoint") as tmp:
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)


def _refusal(error: Exception) -> str:
    """What PyTorch's safe loader refused, without its advice to load the file unsafely."""
    match = re.search(r"(?i)unsupported[^\n]*?(GLOBAL \S+|operand \S+)", str(error))
    return match.group(0).rstrip(".,")[:200] if match else "it holds objects other than tensors and plain values"


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint safely (`weights_only=True`; or a `nmt export` safetensors file) and check
    it (`checked_model`); any problem is a one-line NmtError."""
    checkpoint = _read(Path(path))
    checked_model(checkpoint, path)
    return checkpoint


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise NmtError(f"{path}: no such checkpoint")
    if path.suffix == ".safetensors":
        from nmt_cli.export import load_safetensors

        checkpoint = load_safetensors(path)
    else:
        checkpoint = _torch_load(path)
    if not isinstance(checkpoint, dict) or "format_version" not in checkpoint:
        raise NmtError(f"{path}: not an nmt-cli checkpoint")
    if checkpoint["format_version"] != FORMAT_VERSION:
        raise NmtError(f"{path}: checkpoint format version {checkpoint['format_version']}, this nmt-cli "
                       f"{__version__} reads version {FORMAT_VERSION}")
    return checkpoint


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise NmtError(f"{path}: refused to load: not a plain nmt-cli checkpoint ({_refusal(e)})") from None
    except Exception as e:  # garbage makes torch's safe unpickler fail in many ways (IndexError, KeyError, ...)
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise NmtError(f"{path}: unreadable or truncated checkpoint ({detail})") from None


class _NoDraws(TorchFunctionMode):
    """Skips `normal_` on meta tensors: there is nothing to draw, and PyTorch's meta `normal_`
    imports torch._dynamo (over a second) on its first call."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.nn.init.normal_, torch.Tensor.normal_):
            tensor = args[0] if args else kwargs["tensor"]
            if tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def checked_model(checkpoint: dict[str, Any], path: Path) -> Transformer:
    """The model `checkpoint` describes, built on the meta device (a random initialization would
    only be overwritten: seconds for `big`), once the checkpoint is known to hold a valid
    description and exactly that model's weights, floating point and finite. Its text settings
    are normalized in place (a JSON round trip makes tuples lists)."""
    missing = [key for key in DESCRIPTION if key not in checkpoint and key != "sentencepiece"] + \
        (["model"] if not isinstance(checkpoint.get("model"), dict) else [])
    if missing:
        raise NmtError(f"{path}: damaged checkpoint: no {missing[0]!r}")
    try:
        config = ModelConfig.from_dict(checkpoint["model_config"])
        checkpoint["text_config"] = TextConfig.from_dict(checkpoint["text_config"]).to_dict()
        sizes = [_vocabulary_size(checkpoint[key], key) for key in ("src_vocab", "tgt_vocab")]
        for key, kind in (("bpe_codes", str), ("sentencepiece", bytes)):
            if not isinstance(checkpoint.get(key), (kind, type(None))):
                raise TypeError(f"{key} is a {type(checkpoint[key]).__name__}, not {kind.__name__}")
        with torch.device("meta"), _NoDraws():
            model = Transformer(config, *sizes, PAD_ID, checkpoint["shared_vocab"] is True)
    except (ValueError, TypeError, AttributeError) as e:
        raise NmtError(f"{path}: damaged checkpoint: {e}") from None
    _check_weights(checkpoint["model"], model.state_dict(), path)
    return model


def _vocabulary_size(tokens: Any, key: str) -> int:
    if not isinstance(tokens, list) or tokens[:len(SPECIALS)] != list(SPECIALS) or \
            not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{key} is not a vocabulary starting with {', '.join(SPECIALS)}")
    return len(tokens)


def _check_weights(weights: dict[str, Any], expected: dict[str, torch.Tensor], path: Path) -> None:
    """Exactly the tensors of `expected` (names and shapes), floating point and finite."""
    summed: set[int] = set()  # a tied tensor under several names is summed once
    for name in [*expected, *(name for name in weights if name not in expected)]:
        problem = _weight_problem(weights.get(name), expected.get(name), summed)
        if problem is not None:
            raise NmtError(f"{path}: tensor {name} {problem}")


def _weight_problem(tensor: Any, wanted: torch.Tensor | None, summed: set[int]) -> str | None:
    if tensor is None:
        return "is missing"
    if wanted is None:
        return "is not one of the model's"
    if not isinstance(tensor, torch.Tensor):
        return "is not a tensor"
    if tensor.shape != wanted.shape:
        return f"has shape {list(tensor.shape)}, the config needs {list(wanted.shape)}"
    if not tensor.is_floating_point():
        return f"holds {str(tensor.dtype).removeprefix('torch.')} values, not floating point"
    if id(tensor) not in summed:
        summed.add(id(tensor))
        if not torch.isfinite(tensor.sum()):  # one pass: NaN and inf survive a sum
            return "holds NaN or infinite values (a diverged or damaged model)"
    return None


def load_bundle(path: Path) -> ModelBundle:
    """A model ready for inference (eval mode, CPU) with its text pipeline."""
    checkpoint = _read(Path(path))
    model = checked_model(checkpoint, path)
    model.load_state_dict(checkpoint["model"], assign=True)
    src_vocab = Vocabulary(checkpoint["src_vocab"][4:])
    tgt_vocab = src_vocab if checkpoint["shared_vocab"] else Vocabulary(checkpoint["tgt_vocab"][4:])
    return ModelBundle(model.eval(), TextConfig.from_dict(checkpoint["text_config"]), checkpoint["bpe_codes"],
                       src_vocab, tgt_vocab, checkpoint.get("sentencepiece"))


def numbered(save_dir: Path) -> list[tuple[int, Path]]:
    """`checkpoint_N.pt` files of a save directory, by update number N."""
    found = [(int(m.group(1)), p) for p in Path(save_dir).glob("checkpoint_*.pt") if (m := NUMBERED.search(p.name))]
    return sorted(found)


def prune(save_dir: Path, keep_last: int) -> None:
    """Remove numbered checkpoints beyond the newest `keep_last`."""
    for _, path in numbered(save_dir)[:-keep_last] if keep_last > 0 else []:
        path.unlink(missing_ok=True)


def average(paths: list[Path]) -> dict[str, Any]:
    """Parameter average of checkpoints of one model (§6.1), in fp32, without optimizer state.

    Floating-point tensors are averaged; integer tensors must be equal. The result keeps the first
    checkpoint's description (config, vocabularies, BPE codes, tokenizer) and lists its inputs.
    """
    if not paths:
        raise NmtError("no checkpoints to average")
    first = load(paths[0])
    keys = ("model_config", "text_config", "bpe_codes", "sentencepiece", "src_vocab", "tgt_vocab", "shared_vocab")
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
    result["model"] = averaged
    result["averaged_from"] = [{"path": str(p), "updates": u} for p, u in zip(paths, updates)]
    return result


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    for key in [*a, *(k for k in b if k not in a)]:  # in the config's own order
        if a.get(key) != b.get(key):
            return f"{key} ({a.get(key)} vs {b.get(key)})"
    return "nothing"


def last_checkpoints(save_dir: Path, n: int) -> list[Path]:
    """The `n` numbered checkpoints of `save_dir` with the highest update numbers."""
    found = numbered(save_dir)
    if len(found) < n:
        raise NmtError(f"{save_dir}: {len(found)} numbered checkpoint(s) found, fewer than --last {n}")
    return [path for _, path in found[-n:]]
