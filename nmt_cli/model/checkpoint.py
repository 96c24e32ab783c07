"""Self-describing checkpoints, written atomically and read without running foreign code.

A checkpoint is a dict of plain types and tensors only, so `torch.load(weights_only=True)` reads
it: the model and training configs, the tokenizer settings, the BPE codes, the vocabularies, the
parameters, and (for training checkpoints) optimizer, scaler, progress and RNG states. With it,
`nmt translate -m CKPT` needs nothing else. The same description and weights can be a
safetensors file (memory-mapped, readable from any language; `nmt export --format safetensors`).
Each is checked on load, and one written by an earlier format version is migrated. Averaging
checkpoints (§6.1) lives here too; a training run's save directory is savedir.py's.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import reason, remove_stale_temporaries, replacing
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.model.released import Released
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import PAD_ID, SPECIALS, Vocabulary, model_ids
from nmt_cli.version import __version__

FORMAT_VERSION = 2
LANGUAGE_CODE = re.compile(r">>.+<<")  # a multilingual Marian model's target-language token


@dataclass
class ModelBundle:
    """Everything needed to use a trained model: the network and its text pipeline."""

    model: Transformer
    text: TextConfig
    bpe_codes: str | None
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    sentencepiece: bytes | None = None
    target_sentencepiece: bytes | None = None  # the target side's own model (None: `sentencepiece` serves both)
    released: Released = field(default_factory=lambda: Released())

    @property
    def shared(self) -> bool:
        """One vocabulary for both sides (3-way tying)."""
        return self.src_vocab is self.tgt_vocab

    def pieces(self, side: str) -> bytes | None:
        """The SentencePiece model of the "source" or "target" side (one for both unless the
        model came with two)."""
        own = self.target_sentencepiece if side == "target" else None
        return own if own is not None else self.sentencepiece

    @property
    def never(self) -> list[int]:
        """Target ids no search outputs besides the specials: the vocabulary's fillers, the
        released model's banned tokens."""
        ids = {token: i for i, token in enumerate(self.tgt_vocab.tokens)}  # fillers too, which `index` leaves out
        return sorted({*self.tgt_vocab.fillers, *(ids[token] for token in self.released.never_output)})

    @property
    def language_codes(self) -> list[str]:
        """The target-language tokens (>>code<<) a multilingual Marian model knows."""
        return [t for t in self.src_vocab.tokens if LANGUAGE_CODE.fullmatch(t)] if self.text.language_codes else []

    def summary(self) -> dict[str, Any]:
        """What `nmt info -m` says of the model."""
        config, text = self.model.config, self.text
        sizes = f"{len(self.src_vocab):,} shared" if self.shared else \
            f"{len(self.src_vocab):,} source, {len(self.tgt_vocab):,} target"
        subwords = ("BPE" if self.bpe_codes else "SentencePiece" if text.sentencepiece else "none") + \
            (" (one model per side)" if self.target_sentencepiece is not None else "")
        return {"languages": f"{text.source_lang}-{text.target_lang}",
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "layers": f"{config.encoder_layers} encoder, {config.decoder_layers} decoder",
                "architecture": ", ".join(f"{k} {v}" for k, v in config.to_dict().items()),
                "vocabulary": sizes, "subwords": subwords, "language_codes": self.language_codes,
                "search": ", ".join(f"{k} {v}" for k, v in self.released.search.items()) or "nmt-cli's defaults",
                "origin": self.released.origin or "trained with nmt-cli"}

    def describe(self) -> dict[str, Any]:
        return describe(self.model, self.text, self.bpe_codes, self.src_vocab, self.tgt_vocab, self.sentencepiece,
                        self.target_sentencepiece, self.released)


# What `describe` writes beside the weights ("model"): all a model file needs to be used (`nmt export`
# keeps these in a safetensors file's metadata). The last three may be absent (older checkpoints).
DESCRIPTION = ("format_version", "nmt_cli_version", "model_config", "text_config", "bpe_codes", "src_vocab",
               "tgt_vocab", "shared_vocab", "sentencepiece", "target_sentencepiece", "released")
OPTIONAL = ("sentencepiece", "target_sentencepiece", "released")


def describe(model: Transformer, text: TextConfig, bpe_codes: str | None, src_vocab: Vocabulary,
             tgt_vocab: Vocabulary, sentencepiece: bytes | None = None, target_sentencepiece: bytes | None = None,
             released: Released = Released()) -> dict[str, Any]:
    """The self-describing part of every checkpoint of `model`: the DESCRIPTION fields and the weights."""
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return description(model.config, weights, model.src_embed.tokens is model.tgt_embed.tokens, text, bpe_codes,
                       src_vocab, tgt_vocab, sentencepiece, target_sentencepiece, released)


def description(config: ModelConfig, weights: dict[str, torch.Tensor], shared_vocab: bool, text: TextConfig,
                bpe_codes: str | None, src_vocab: Vocabulary, tgt_vocab: Vocabulary,
                sentencepiece: bytes | None = None, target_sentencepiece: bytes | None = None,
                released: Released = Released()) -> dict[str, Any]:
    """The DESCRIPTION fields and the weights of a model not built (`nmt import` converts a release's
    weights without a second copy of them in a model): the one writer of a checkpoint's dictionary."""
    return {
        "format_version": FORMAT_VERSION,
        "nmt_cli_version": __version__,
        "model_config": config.to_dict(),
        "text_config": text.to_dict(),
        "bpe_codes": bpe_codes,
        "sentencepiece": sentencepiece,
        "target_sentencepiece": target_sentencepiece,
        "src_vocab": src_vocab.tokens,
        "tgt_vocab": tgt_vocab.tokens,
        "shared_vocab": shared_vocab,
        "released": released.to_dict(),
        "model": weights,
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
        raise NmtError(f"{path}: {_not_a_checkpoint(path)}")
    if path.suffix == ".safetensors":
        checkpoint = load_safetensors(path)
    else:
        checkpoint = _torch_load(path)
    if not isinstance(checkpoint, dict) or "format_version" not in checkpoint:
        raise NmtError(f"{path}: not an nmt-cli checkpoint")
    version = checkpoint["format_version"]
    if version not in MIGRATIONS and version != FORMAT_VERSION:
        raise NmtError(f"{path}: checkpoint format version {version}, this nmt-cli {__version__} reads versions "
                       f"{', '.join(map(str, [*MIGRATIONS, FORMAT_VERSION]))}")
    while checkpoint["format_version"] != FORMAT_VERSION:
        checkpoint = MIGRATIONS[checkpoint["format_version"]](checkpoint)
    return checkpoint


def _not_a_checkpoint(path: Path) -> str:
    """Why `path`, not a file, is no checkpoint; a save directory's checkpoint to pass, named."""
    if not path.is_dir():
        return "no such checkpoint"
    if (path / "checkpoint_best.pt").is_file():
        return (f"a save directory, not a checkpoint: pass {path / 'checkpoint_best.pt'}, or an average (nmt "
                f"average-checkpoints --dir {path} -o avg.pt)")
    if (path / "meta.json").is_file():
        return "a data directory (nmt preprocess's), not a checkpoint: pass a checkpoint that nmt train wrote"
    return "a directory, not a checkpoint file"


def _projection_named(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: the pre-softmax projection became a module of its own (tied to the target
    embedding, §3.4), so its weight has a name in the weights."""
    weights = checkpoint.get("model")
    if isinstance(weights, dict) and "tgt_embed.tokens.weight" in weights:
        weights = {**weights, "output_projection.weight": weights["tgt_embed.tokens.weight"]}
    return {**checkpoint, "model": weights, "format_version": 2}


# Each earlier format version's step to the next one, applied in turn on load.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _projection_named}


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
    missing = [key for key in DESCRIPTION if key not in checkpoint and key not in OPTIONAL] + \
        (["model"] if not isinstance(checkpoint.get("model"), dict) else [])
    if missing:
        raise NmtError(f"{path}: damaged checkpoint: no {missing[0]!r}")
    try:
        config = ModelConfig.from_dict(checkpoint["model_config"])
        checkpoint["text_config"] = TextConfig.from_dict(checkpoint["text_config"]).to_dict()
        sizes = [_vocabulary_size(checkpoint[key], key) for key in ("src_vocab", "tgt_vocab")]
        for key, kind in (("bpe_codes", str), ("sentencepiece", bytes), ("target_sentencepiece", bytes)):
            if not isinstance(checkpoint.get(key), (kind, type(None))):
                raise TypeError(f"{key} is a {type(checkpoint[key]).__name__}, not {kind.__name__}")
        released = Released.from_dict(checkpoint.get("released"))
        unknown = [t for t in released.never_output if t not in checkpoint["tgt_vocab"]]
        if unknown:
            raise ValueError(f"released.never_output names {unknown[0]!r}, which the target vocabulary lacks")
        with torch.device("meta"), _NoDraws():
            model = Transformer(config, *sizes, PAD_ID, checkpoint["shared_vocab"] is True,
                                **model_ids(config.decoder_start, config.source_eos))
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
    return bundle_of(_read(Path(path)), path)


def bundle_of(checkpoint: dict[str, Any], path: Path) -> ModelBundle:
    """The model (its weights those of `checkpoint`, read from `path`) and text pipeline."""
    model = checked_model(checkpoint, path)
    model.load_state_dict(checkpoint["model"], assign=True)
    model.tie_weights()  # assigned, the projection's weight is a tensor of its own: the embedding's again
    src_vocab = Vocabulary(checkpoint["src_vocab"][4:])
    tgt_vocab = src_vocab if checkpoint["shared_vocab"] else Vocabulary(checkpoint["tgt_vocab"][4:])
    return ModelBundle(model.eval(), TextConfig.from_dict(checkpoint["text_config"]), checkpoint["bpe_codes"],
                       src_vocab, tgt_vocab, checkpoint.get("sentencepiece"), checkpoint.get("target_sentencepiece"),
                       Released.from_dict(checkpoint.get("released")))


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise NmtError("safetensors files need the safetensors package: pip install 'nmt-cli[export]' "
                       "(or pip install safetensors)") from None
    return safetensors


def save_safetensors(checkpoint: dict[str, Any], path: Path) -> None:
    """The checkpoint's weights and description (JSON metadata); a tensor tied to another one
    (3-way tying) is stored once and named as an alias."""
    serialize = _safetensors().torch.save

    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    for name, tensor in checkpoint["model"].items():
        key = (tensor.data_ptr(), tuple(tensor.shape))  # the same tensor under two names
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key], tensors[name] = name, tensor.contiguous()
    description = {key: checkpoint.get(key) for key in DESCRIPTION}
    for key in ("sentencepiece", "target_sentencepiece"):
        if description[key] is not None:
            description[key] = base64.b64encode(description[key]).decode("ascii")
    metadata = {"nmt_cli": json.dumps(description, ensure_ascii=False), "aliases": json.dumps(aliases)}
    data = serialize(tensors, metadata=metadata)  # written by us: the usual file mode, errors as OSError
    remove_stale_temporaries(path.parent)  # those of an export that was killed
    with replacing(path, "safetensors file") as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def load_safetensors(path: Path) -> dict[str, Any]:
    """A checkpoint dict (description and weights) from a file `save_safetensors` wrote."""
    safetensors = _safetensors()
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            weights = {name: f.get_tensor(name) for name in f.keys()}
    except (safetensors.SafetensorError, OSError) as e:
        raise NmtError(f"{path}: not a readable safetensors file ({e})") from None
    if "nmt_cli" not in metadata:
        raise NmtError(f"{path}: a safetensors file without nmt-cli's description (export it with `nmt export`)")
    try:
        checkpoint = json.loads(metadata["nmt_cli"])
        for name, original in json.loads(metadata.get("aliases", "{}")).items():
            weights[name] = weights[original]
        for key in ("sentencepiece", "target_sentencepiece"):
            if checkpoint.get(key) is not None:
                checkpoint[key] = base64.b64decode(checkpoint[key])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise NmtError(f"{path}: nmt-cli's description in it is damaged ({type(e).__name__}: {e})") from None
    return {**checkpoint, "model": weights}  # load checks the format version
