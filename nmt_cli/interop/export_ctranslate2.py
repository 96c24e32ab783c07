"""`nmt export --format ctranslate2`: a checkpoint for use outside nmt-cli, as a CTranslate2 model
directory (the field's production inference engine: CPU int8, GPU float16, C++ and Python APIs)
with the same weights, every architecture nmt-cli trains (post- and pre-norm, sinusoidal and
learned positions, joint and separate vocabularies); beside it the BPE codes or SentencePiece
model and `nmt-cli.json`, which says how to turn text into the model's tokens and back. The
directory is written whole or not at all, and replaces only an earlier export
(writing.write_export).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.errors import NmtError
from nmt_cli.interop.writing import text_files, write_export
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.model.transformer import MultiHeadAttention, Transformer

if TYPE_CHECKING:
    from nmt_cli.interop.exporter import ExportRequest


def export(request: ExportRequest) -> None:
    """`nmt export --format ctranslate2`, with --quantize and --shortlist."""
    bundle = load_bundle(request.model)
    shortlist = request.config.shortlist and Shortlist.load(request.config.shortlist, bundle)
    save_ctranslate2(bundle, request.output, request.config.quantization, shortlist)


def save_ctranslate2(bundle: ModelBundle, out: Path, quantization: str | None = None,
                     shortlist: Shortlist | None = None) -> None:
    """A CTranslate2 model directory of `bundle`, with the text pipeline's files beside it, and a
    `shortlist` as CTranslate2's vocabulary map (`translate_batch(..., use_vmap=True)`)."""
    write_export(out, lambda tmp: write_ctranslate2(bundle, tmp, quantization, shortlist))


def write_ctranslate2(bundle: ModelBundle, folder: Path, quantization: str | None = None,
                      shortlist: Shortlist | None = None) -> None:
    """The CTranslate2 model of `bundle` and its text pipeline's files into the new `folder` (an
    Argos package's `model/` too)."""
    try:
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise NmtError("--format ctranslate2 needs CTranslate2: pip install 'nmt-cli[export]' "
                       "(or pip install ctranslate2)") from None
    model, config = bundle.model, bundle.model.config
    if config.d_k != config.d_model // config.heads or config.d_v != config.d_k:
        raise NmtError(f"CTranslate2 needs d_k = d_v = d_model / heads; this model has d_k {config.d_k}, "
                       f"d_v {config.d_v} with d_model {config.d_model} and {config.heads} heads")
    pre_norm = config.norm == "pre"
    activation = getattr(common_spec.Activation, CT2_ACTIVATIONS[config.activation])
    spec = transformer_spec.TransformerSpec.from_config((config.encoder_layers, config.decoder_layers),
                                                        config.heads, pre_norm=pre_norm, activation=activation,
                                                        layernorm_embedding=config.embedding_norm)
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
    spec.config.add_source_eos = config.source_eos
    if config.decoder_start == "eos":  # fairseq's models
        spec.config.decoder_start_token = spec.config.eos_token
    spec.register_source_vocabulary(bundle.src_vocab.tokens)
    spec.register_target_vocabulary(bundle.tgt_vocab.tokens)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(folder))
    text_files(bundle, folder)
    if shortlist is not None:
        (folder / "vmap.txt").write_text(vocabulary_map(shortlist, bundle), encoding="utf-8")


def vocabulary_map(shortlist: Shortlist, bundle: ModelBundle) -> str:
    """A shortlist as CTranslate2's vocabulary map: the always-candidates after an empty source,
    then each source token with its candidates (`source<TAB>target target ...`)."""
    source, target = bundle.src_vocab.tokens, bundle.tgt_vocab.tokens
    lines = ["\t" + " ".join(target[i] for i in shortlist.frequent)]
    lines += [f"{source[i]}\t{' '.join(target[t] for t in row[row >= 0])}"
              for i, row in enumerate(shortlist.candidates) if (row >= 0).any()]
    return "\n".join(lines) + "\n"


def _array(tensor: torch.Tensor) -> Any:
    """A float32 copy of `tensor` (CTranslate2's quantization scales its arrays in place: never
    the model's own weights)."""
    return tensor.detach().float().cpu().numpy().copy()


# Our FFN activations by CTranslate2's names.
CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu-tanh": "GELUTanh", "gelu-sigmoid": "GELUSigmoid",
                   "swish": "SWISH"}


def _embeddings(spec: Any, model: Transformer) -> None:
    for side, embedding in ((spec.encoder, model.src_embed), (spec.decoder, model.tgt_embed)):
        side.scale_embeddings = model.config.scale_embeddings
        table = embedding.learned.weight if embedding.learned is not None else embedding.sinusoid
        side.position_encodings.encodings = _array(table)
        if embedding.norm is not None:
            _norm(side.layernorm_embedding, embedding.norm)
    spec.encoder.embeddings[0].weight = _array(model.src_embed.tokens.weight)
    spec.decoder.embeddings.weight = _array(model.tgt_embed.tokens.weight)
    _linear(spec.decoder.projection, model.output_projection)  # tied to the embedding (§3.4) unless untied


def _linear(spec: Any, module: torch.nn.Linear) -> None:
    spec.weight = _array(module.weight)
    if module.bias is not None:
        spec.bias = _array(module.bias)


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
