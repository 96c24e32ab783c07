"""`nmt export`: a checkpoint for use outside nmt-cli.

- `ctranslate2`: a CTranslate2 model directory (the field's production inference engine: CPU
  int8, GPU float16, C++ and Python APIs) with the same weights, every architecture nmt-cli
  trains (post- and pre-norm, sinusoidal and learned positions, joint and separate
  vocabularies); beside it the BPE codes or SentencePiece model and `nmt-cli.json`, which says
  how to turn text into the model's tokens and back.
- `safetensors`: the weights as a safetensors file (memory-mapped, readable from any language),
  with the checkpoint's description (configs, vocabularies, BPE codes) as JSON in its metadata;
  `nmt translate -m FILE.safetensors` reads it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nmt_cli import NmtError
from nmt_cli.checkpoint import DESCRIPTION, ModelBundle
from nmt_cli.config import SearchConfig
from nmt_cli.files import publish_directory, reason, remove_stale_temporaries, replacing, temporary_directory
from nmt_cli.model import MultiHeadAttention, Transformer

# ---------------------------------------------------------------------------- safetensors

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
    if description["sentencepiece"] is not None:
        description["sentencepiece"] = base64.b64encode(description["sentencepiece"]).decode("ascii")
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
        if checkpoint.get("sentencepiece") is not None:
            checkpoint["sentencepiece"] = base64.b64decode(checkpoint["sentencepiece"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise NmtError(f"{path}: nmt-cli's description in it is damaged ({type(e).__name__}: {e})") from None
    return {**checkpoint, "model": weights}  # checkpoint.load checks the format version


# ---------------------------------------------------------------------------- CTranslate2

def save_ctranslate2(bundle: ModelBundle, out: Path, quantization: str | None = None) -> None:
    """A CTranslate2 model directory of `bundle`, with the text pipeline's files beside it."""
    try:
        from ctranslate2.specs import transformer_spec
    except ImportError:
        raise NmtError("--format ctranslate2 needs CTranslate2: pip install 'nmt-cli[export]' "
                       "(or pip install ctranslate2)") from None
    model, config = bundle.model, bundle.model.config
    if config.d_k != config.d_model // config.heads or config.d_v != config.d_k:
        raise NmtError(f"CTranslate2 needs d_k = d_v = d_model / heads; this model has d_k {config.d_k}, "
                       f"d_v {config.d_v} with d_model {config.d_model} and {config.heads} heads")
    pre_norm = config.norm == "pre"
    spec = transformer_spec.TransformerSpec.from_config((config.encoder_layers, config.decoder_layers),
                                                        config.heads, pre_norm=pre_norm)
    _embeddings(spec, model)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.sublayers[0].norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.sublayers[1].norm)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.sublayers[0].norm)
        _attention(layer_spec.attention, layer.cross_attn, layer.sublayers[1].norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.sublayers[2].norm)
    if pre_norm:
        _norm(spec.encoder.layer_norm, model.encoder_norm)
        _norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.config.layer_norm_epsilon = model.encoder_layers[0].sublayers[0].norm.eps
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(bundle.src_vocab.tokens)
    spec.register_target_vocabulary(bundle.tgt_vocab.tokens)
    spec.validate()
    spec.optimize(quantization=quantization)

    def write(tmp: Path) -> None:
        spec.save(str(tmp))
        _text_files(bundle, tmp)

    _write_directory(out, write)


# What an export writes: a directory holding only these (and nmt-cli.json) is an earlier export.
EXPORT_FILES = {"model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json",
                "target_vocabulary.json", "bpe.codes", "spm.model", "nmt-cli.json"}


def _check_destination(out: Path) -> None:
    """Refuse to replace anything but an earlier export: a user's files are never deleted."""
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise NmtError(f"{out}: is the current directory or holds it; choose a new --output")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise NmtError(f"{out}: exists and is not a directory; choose another --output")
    names = {p.name for p in out.iterdir()}
    if names and ("nmt-cli.json" not in names or not names <= EXPORT_FILES):
        raise NmtError(f"{out}: the directory holds files that are not an earlier export; choose another "
                       "--output or empty it")


def _write_directory(out: Path, write: Callable[[Path], None]) -> None:
    """`write` a temporary directory beside `out`, then rename it to `out` (replacing an earlier
    export): a failed or interrupted export leaves `out` as it was."""
    out = Path(os.path.abspath(out))  # `-o .` has no name to put a temporary beside
    _check_destination(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out.parent)
        tmp = temporary_directory(out)
    except OSError as e:
        raise NmtError(f"{out.parent}: cannot write there ({reason(e)})") from None
    try:
        write(tmp)
        _check_destination(out)  # again: another program may have written there meanwhile
        publish_directory(tmp, out)
    except OSError as e:
        raise NmtError(f"{out}: cannot write the model directory ({reason(e)}); nothing was written") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _array(tensor: torch.Tensor) -> Any:
    return tensor.detach().float().cpu().numpy()


def _embeddings(spec: Any, model: Transformer) -> None:
    for side, embedding in ((spec.encoder, model.src_embed), (spec.decoder, model.tgt_embed)):
        side.scale_embeddings = True
        table = embedding.learned.weight if embedding.learned is not None else embedding.sinusoid
        side.position_encodings.encodings = _array(table)
    spec.encoder.embeddings[0].weight = _array(model.src_embed.tokens.weight)
    spec.decoder.embeddings.weight = _array(model.tgt_embed.tokens.weight)
    spec.decoder.projection.weight = _array(model.tgt_embed.tokens.weight)  # tied (§3.4)


def _linear(spec: Any, module: torch.nn.Linear) -> None:
    spec.weight, spec.bias = _array(module.weight), _array(module.bias)


def _norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _attention(spec: Any, module: MultiHeadAttention, norm: torch.nn.LayerNorm) -> None:
    projections = [module.qkv, module.out] if hasattr(module, "qkv") else [module.q, module.kv, module.out]
    for target, source in zip(spec.linear, projections):
        _linear(target, source)
    _norm(spec.layer_norm, norm)


def _ffn(spec: Any, ffn: Any, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear_0, ffn.w1)
    _linear(spec.linear_1, ffn.w2)
    _norm(spec.layer_norm, norm)


def _text_files(bundle: ModelBundle, out: Path) -> None:
    """The subword model and `nmt-cli.json`: how text becomes the model's tokens and back."""
    text = bundle.text
    if bundle.bpe_codes is not None:
        (out / "bpe.codes").write_text(bundle.bpe_codes, encoding="utf-8")
    if bundle.sentencepiece is not None:
        (out / "spm.model").write_bytes(bundle.sentencepiece)
    if text.sentencepiece:
        steps = ["encode the line with spm.model (SentencePiece) into pieces; the model adds </s> itself",
                 "decode the output pieces with spm.model"]
    else:
        steps = [f"Moses punctuation normalization and tokenization (sacremoses, lang {text.source_lang}, "
                 "escape=False) with the settings below" if text.tokenizer == "moses" else "split on whitespace",
                 "apply bpe.codes with subword-nmt (separator @@)" if bundle.bpe_codes else "no BPE",
                 "translate the tokens; the model adds </s> to the source itself",
                 "join '@@ ' in the output, then Moses detokenization (lang "
                 f"{text.target_lang})" if text.tokenizer == "moses" else "join '@@ ' in the output"]
    search = SearchConfig()
    about = {"text_config": text.to_dict(), "steps": steps, "model_config": bundle.model.config.to_dict(),
             "search": {"beam_size": search.beam, "length_penalty": search.lenpen,
                        "max_decoding_length": bundle.model.config.max_positions - 1,
                        "note": "nmt-cli divides scores by ((5 + |Y|) / 6)^alpha (GNMT); CTranslate2 by |Y|^alpha"}}
    (out / "nmt-cli.json").write_text(json.dumps(about, indent=2) + "\n", encoding="utf-8")
