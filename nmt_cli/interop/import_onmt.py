"""OpenNMT-py 3.x checkpoints (`model_step_N.pt` of its `transformer` encoder and decoder) read into
a `Release`, its weights, vocabularies and options in the one file (reading.load_pickled reads
it without running pickled code), or its weights beside it as safetensors (`-save_format
safetensors`).

OpenNMT-py's Transformer is ours pre-norm (a norm before each sublayer, and one after each stack)
up to these layouts, which the import undoes exactly:
- its sources end without </s> (ModelConfig.source_eos); its targets start from <s>;
- its layer norms' epsilon is its `norm_eps` (1e-6);
- Q, K, V and the attention's output have biases only with `add_qkvbias`, the FFN only with
  `add_ffnbias`: absent ones are zeros; its generator (the pre-softmax projection) has one;
- its vocabularies put <unk> 0, <blank> (the padding) 1, <s> 2, </s> 3, and pad to a multiple of
  `vocab_size_multiple` with fillers, which stay ordinary tokens;
- `SinusoidalConcat` positions put a position's sines first (Marian's layout: `Release.order`).
What ours cannot hold (relative or rotary positions, RMS norms, parallel residuals, grouped
keys and values, gated FFNs, copy attention, source features, a language model, a decoder that
starts elsewhere than <s>) is refused in one line naming the option. The search settings are
onmt_translate's defaults: beam 5 and its beam's rules, scores over the hypothesis' length
counting <s> ("avg"), at most 1.25 x the source + 5 tokens and 250 (and there no </s>), no
minimum length.
"""

from __future__ import annotations

import argparse
import glob
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.interop.reading import read_codes, safetensors_file, sentencepiece_file, token_id
from nmt_cli.interop.release import Release, Side, check_rows, peer_text, sines_then_cosines
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.run_config import ImportConfig

ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}
# Options of OpenNMT-py's models that ours cannot hold, each refused where it is not the value given.
PLAIN = {"encoder_type": "transformer", "decoder_type": "transformer", "model_task": "seq2seq",
         "max_relative_positions": 0, "layer_norm": "standard", "parallel_residual": False, "num_kv": 0,
         "copy_attn": False, "position_encoding": True}
SPECIALS = {"pad": "<blank>", "start": "<s>", "eos": "</s>", "unk": "<unk>"}  # OpenNMT-py's DefaultTokens


def read_onmt(path: Path, state: dict[str, Any], given: ImportConfig, warn: Callable[[str], None]) -> Release:
    """An OpenNMT-py checkpoint (its `state`), with the languages and text pipeline `given` or the
    subword model its options name, found beside the checkpoint."""
    if given.source_lang is None or given.target_lang is None:
        raise NmtError(f"{path}: an OpenNMT-py checkpoint names no languages: give -s SRC -t TGT")
    opt = vars(state["opt"]) if isinstance(state["opt"], argparse.Namespace) else {}
    vocab, model, generator = state["vocab"], state.get("model"), state.get("generator")
    if not isinstance(vocab, dict):
        raise NmtError(f"{path}: its vocabularies are not a dictionary")
    if model is None and generator is None:
        model, generator = safetensors_weights(path)
    if not isinstance(model, dict) or not isinstance(generator, dict):
        raise NmtError(f"{path}: its weights are not dictionaries of tensors")
    if vocab.get("src_feats"):
        raise NmtError(f"{path}: a model of source features, which nmt-cli's model does not have")
    if vocab.get("decoder_start_token", "<s>") != "<s>":
        raise NmtError(f"{path}: its decoder starts from {vocab['decoder_start_token']!r}: nmt-cli's starts from <s>")
    config, shared = onmt_config(opt, path)
    tokens = [onmt_vocabulary(vocab, side, path) for side in ("src", "tgt")]
    sides = [Side(side, *(token_id(side, SPECIALS[role], path) for role in ("pad", "start", "eos", "unk")))
             for side in tokens]
    weights = onmt_weights(model, generator, config, shared, opt, path)
    check_rows(weights, shared, (tokens[0], tokens[1]), (f"{path}: its src vocabulary", f"{path}: its tgt vocabulary"))
    text, codes, pieces = onmt_text(opt, given, (given.source_lang, given.target_lang), path, warn)
    order = sines_then_cosines(config.d_model) if opt.get("position_encoding_type") == "SinusoidalConcat" else None
    return Release(config, weights, sides[0], sides[1], shared, text, pieces, pieces, codes, onmt_search(),
                   origin=f"OpenNMT-py ({path.name})", order=order)


def safetensors_weights(path: Path) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The model's and the generator's weights of a checkpoint saved with `-save_format safetensors`:
    NAME.safetensors beside NAME.pt (onmt_train's), or its shards NAME.*.safetensors."""
    files = [path.with_suffix(".safetensors")] if path.with_suffix(".safetensors").is_file() else shards(path)
    if not files:
        raise NmtError(f"{path}: no weights in it, and no {path.with_suffix('.safetensors').name} beside it (its "
                       "-save_format safetensors)")
    weights: dict[str, Tensor] = {}
    found_in: dict[str, Path] = {}
    for file in files:
        for name, tensor in safetensors_file(file).items():
            if name in found_in:
                raise NmtError(f"{file}: {name} again (also in {found_in[name].name}): shards hold a weight each")
            weights[name], found_in[name] = tensor, file
    generator = {name.removeprefix("generator."): weights.pop(name) for name in list(weights)
                 if name.startswith("generator.")}
    return weights, generator


def shards(path: Path) -> list[Path]:
    """The shards OpenNMT-py writes beside NAME.pt, NAME.0.safetensors to NAME.{K-1}.safetensors,
    in order; another file of that pattern (NAME.old.safetensors) is not one, and numbers that do
    not run from 0 are refused naming them."""
    numbered = sorted((int(match[1]), file) for file in path.parent.glob(f"{glob.escape(path.stem)}.*.safetensors")
                      if (match := re.fullmatch(re.escape(path.stem) + r"\.(0|[1-9][0-9]{0,3})\.safetensors",
                                                file.name)))
    if [n for n, _ in numbered] != list(range(len(numbered))):
        names = ", ".join(file.name for _, file in numbered)
        raise NmtError(f"{path}: its shards are {names}; OpenNMT-py writes {path.stem}.0.safetensors on, one a number")
    return [file for _, file in numbered]


def onmt_vocabulary(vocab: dict[str, Any], side: str, path: Path) -> list[str]:
    tokens = vocab.get(side)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) or len(set(tokens)) != len(tokens):
        raise NmtError(f"{path}: its {side} vocabulary is not a list of distinct tokens")
    return tokens


def onmt_config(opt: dict[str, Any], path: Path) -> tuple[ModelConfig, bool]:
    """Our ModelConfig of OpenNMT-py's options and whether both sides share one embedding; a
    one-line refusal naming what ours cannot hold."""
    for name, plain in PLAIN.items():
        if opt.get(name, plain) != plain:
            raise NmtError(f"{path}: -{name} {opt[name]!r}: nmt-cli's model holds only {plain!r} there")
    activation = opt.get("pos_ffn_activation_fn", "relu")
    if activation not in ACTIVATIONS:
        raise NmtError(f"{path}: -pos_ffn_activation_fn {activation!r} (nmt-cli has {', '.join(ACTIVATIONS)})")
    sizes = {opt.get(key) for key in ("hidden_size", "enc_hid_size", "dec_hid_size", "word_vec_size") if key in opt}
    if len(sizes) != 1:
        raise NmtError(f"{path}: its hidden and embedding sizes differ ({sorted(map(str, sizes))}): nmt-cli's are one")
    dropout, attention_dropout = (last_of(opt, name, 0.1, path) for name in ("dropout", "attention_dropout"))
    try:
        config = ModelConfig(
            encoder_layers=opt["enc_layers"], decoder_layers=opt["dec_layers"], d_model=sizes.pop(),
            d_ff=opt["transformer_ff"], heads=opt["heads"], dropout=dropout,
            attention_dropout=attention_dropout, label_smoothing=float(opt.get("label_smoothing", 0.0)),
            positions="sinusoidal", max_positions=5000, activation=ACTIVATIONS[activation], norm="pre",
            tied_output=bool(opt.get("share_decoder_embeddings")), output_bias=True,
            norm_eps=float(opt.get("norm_eps", 1e-6)), source_eos=False)
    except KeyError as e:
        raise NmtError(f"{path}: its options have no {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:
        raise NmtError(f"{path}: {e}") from None
    return config, bool(opt.get("share_embeddings"))


def last_of(opt: dict[str, Any], name: str, default: float, path: Path) -> float:
    """An option OpenNMT-py keeps as a list, one value a stage of its schedule (-dropout): the last,
    which training ended with; a number as it is; anything else refused in one line."""
    value = opt.get(name, default)
    last = value[-1] if isinstance(value, list) and value else value
    if isinstance(last, bool) or not isinstance(last, (int, float)):
        raise NmtError(f"{path}: -{name} {value!r}: expected a number or a list of numbers")
    return float(last)


def onmt_weights(model: dict[str, Tensor], generator: dict[str, Tensor], config: ModelConfig, shared: bool,
                 opt: dict[str, Any], path: Path) -> dict[str, Tensor]:
    """OpenNMT-py's weights under our names (rows in its vocabularies' ids), absent biases as zeros."""
    def take(name: str, where: dict[str, Tensor] = model) -> Tensor:
        if not isinstance(where.get(name), Tensor) or not where[name].is_floating_point():
            raise NmtError(f"{path}: the weights have no tensor {name}")
        return where[name].float()

    def bias(name: str, rows: int, present: bool) -> Tensor:
        return take(name) if present else torch.zeros(rows)

    d, qkv_bias, ffn_bias = config.d_model, bool(opt.get("add_qkvbias")), bool(opt.get("add_ffnbias"))

    def linear(ours: str, theirs: str, present: bool) -> dict[str, Tensor]:
        weight = take(f"{theirs}.weight")
        return {f"{ours}.weight": weight, f"{ours}.bias": bias(f"{theirs}.bias", weight.size(0), present)}

    def attention(ours: str, theirs: str, fused: tuple[str, ...]) -> dict[str, Tensor]:
        parts = [linear("", f"{theirs}.linear_{name}", qkv_bias) for name in fused]
        out = {f"{ours}.{'qkv' if len(fused) == 3 else 'kv'}.{kind}": torch.cat([p[f".{kind}"] for p in parts])
               for kind in ("weight", "bias")}
        return {**out, **linear(f"{ours}.out", f"{theirs}.final_linear", qkv_bias)}

    def norm(ours: str, theirs: str) -> dict[str, Tensor]:
        return {f"{ours}.weight": take(f"{theirs}.weight"), f"{ours}.bias": take(f"{theirs}.bias")}

    weights = {"tgt_embed.tokens.weight": take("decoder.embeddings.make_embedding.emb_luts.0.weight"),
               "output_projection.bias": take("bias", generator)}
    if not shared:
        weights["src_embed.tokens.weight"] = take("encoder.embeddings.make_embedding.emb_luts.0.weight")
    if not config.tied_output:
        weights["output_projection.weight"] = take("weight", generator)
    for side, theirs, layers in (("encoder", "encoder.transformer", config.encoder_layers),
                                 ("decoder", "decoder.transformer_layers", config.decoder_layers)):
        for i in range(layers):
            ours, at = f"{side}_layers.{i}", f"{theirs}.{i}"
            weights.update(attention(f"{ours}.self_attn", f"{at}.self_attn", ("query", "keys", "values")))
            norms = ["layer_norm"] if side == "encoder" else ["layer_norm_1", "layer_norm_2"]
            if side == "decoder":
                weights.update(attention(f"{ours}.cross_attn", f"{at}.context_attn", ("keys", "values")))
                weights.update(linear(f"{ours}.cross_attn.q", f"{at}.context_attn.linear_query", qkv_bias))
            for n, name in enumerate([*norms, "feed_forward.layer_norm"]):
                weights.update(norm(f"{ours}.sublayers.{n}.norm", f"{at}.{name}"))
            weights.update(linear(f"{ours}.ffn.w1", f"{at}.feed_forward.w_1", ffn_bias))
            weights.update(linear(f"{ours}.ffn.w2", f"{at}.feed_forward.w_2", ffn_bias))
        weights.update(norm(f"{side}_norm", f"{side}.layer_norm"))
    if weights["tgt_embed.tokens.weight"].size(1) != d:
        raise NmtError(f"{path}: its embeddings are {weights['tgt_embed.tokens.weight'].size(1)} wide, its model {d}")
    return weights


def onmt_text(opt: dict[str, Any], given: ImportConfig, langs: tuple[str, str], path: Path,
              warn: Callable[[str], None]) -> tuple[TextConfig, str | None, bytes | None]:
    """The text pipeline: the BPE codes or SentencePiece model given, else the one the options name
    (`bpe` or `sentencepiece` among its transforms) where a file of that name is beside the
    checkpoint (never where the options point: a checkpoint is not trusted to name a file to
    read), else words. Says which file it read."""
    transforms = opt.get("transforms") or []
    subword = next((t for t in ("sentencepiece", "bpe") if t in transforms), None)
    found = None
    if subword and not (given.sentencepiece or given.bpe_codes) and opt.get("src_subword_model"):
        found = path.parent / Path(str(opt["src_subword_model"])).name
        if not found.is_file():
            flag = "--sentencepiece" if subword == "sentencepiece" else "--bpe-codes"
            raise NmtError(f"{path}: its options name the {subword} model {opt['src_subword_model']}, and no "
                           f"{found.name} is beside it: give {flag} FILE (a file the options name elsewhere is "
                           "never read)")
        warn(f"note: {path}: its {subword} model: {found}")
    pieces_path = given.sentencepiece or (found if subword == "sentencepiece" else None)
    codes_path = given.bpe_codes or (found if subword == "bpe" else None)
    text = peer_text(langs, given.tokenizer, pieces_path is not None, "OpenNMT-py")
    if pieces_path is not None:
        return text, None, sentencepiece_file(pieces_path)
    return text, read_codes(codes_path) if codes_path else None, None


def onmt_search() -> dict[str, Any]:
    """onmt_translate's defaults: beam 5 with its own stopping, a hypothesis' score over its
    length counting <s> ("avg"), at most 1.25 x the source + 5 tokens and at most 250 (and then
    no </s>), </s> allowed first."""
    return {"beam": 5, "lenpen": 1.0, "lenpen_form": "length", "lenpen_start": True, "stopping": "onmt",
            "at_limit": "cut", "max_len_a": 1.25, "max_len_b": 5, "max_len": 250, "min_len": 0, "allow_unk": True}
