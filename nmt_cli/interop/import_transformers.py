"""Released models in transformers' format: a Hugging Face `MarianMTModel` directory (the OPUS-MT
models: config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json,
tokenizer_config.json, generation_config.json when present), read into a `Release` exactly as
transformers runs it: MarianConfig's defaults where config.json is silent, weights read without
running code from a file, the positions checked, and the search that `generate()` runs."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import note_read
from nmt_cli.interop.reading import (
    check_storage,
    read_json,
    safetensors_file,
    sentencepiece_file,
    setting,
    token_id,
    tokens_by_id,
    unpickling_error,
)
from nmt_cli.interop.release import Release, Side, layer_weights, marian_text, sines_then_cosines
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.model.transformer import positional_encoding
from nmt_cli.run_config import ImportConfig

# MarianConfig's defaults (transformers 5), which a saved config.json leaves out.
MARIAN_DEFAULTS = {"vocab_size": 58101, "max_position_embeddings": 1024, "encoder_layers": 12, "encoder_ffn_dim": 4096,
                   "encoder_attention_heads": 16, "decoder_layers": 12, "decoder_ffn_dim": 4096,
                   "decoder_attention_heads": 16, "activation_function": "gelu", "d_model": 1024, "dropout": 0.1,
                   "attention_dropout": 0.0, "activation_dropout": 0.0, "decoder_start_token_id": 58100,
                   "scale_embedding": False, "pad_token_id": 58100, "eos_token_id": 0,
                   "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "forced_eos_token_id": 0}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu-tanh", "gelu_fast": "gelu-tanh",
               "gelu_pytorch_tanh": "gelu-tanh", "quick_gelu": "gelu-sigmoid", "swish": "swish", "silu": "swish"}


def read_transformers(source: Path, options: ImportConfig, warn: Callable[[str], None]) -> Release:
    """A Hugging Face MarianMTModel directory."""
    config = read_json(source / "config.json")
    if not isinstance(config, dict) or config.get("model_type") != "marian":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise NmtError(f"{source / 'config.json'}: model_type {kind!r}; nmt import reads MarianMTModel ('marian')")
    config = {**MARIAN_DEFAULTS, **config}  # transformers writes only the values that differ from these
    tokenizer = read_json(source / "tokenizer_config.json") if (source / "tokenizer_config.json").is_file() else {}
    separate = bool(tokenizer.get("separate_vocabs"))
    names = {role: str(tokenizer.get(f"{role}_token", default))
             for role, default in (("eos", "</s>"), ("unk", "<unk>"), ("pad", "<pad>"))}
    src_tokens = vocabulary(source / "vocab.json")
    tgt_tokens = vocabulary(source / "target_vocab.json") if separate else src_tokens
    vocab_sizes = (config["vocab_size"], config.get("decoder_vocab_size") or config["vocab_size"])
    for key, size, tokens, name in zip(("vocab_size", "decoder_vocab_size"), vocab_sizes, (src_tokens, tgt_tokens),
                                       ("vocab.json", "target_vocab.json" if separate else "vocab.json")):
        if size != len(tokens):
            raise NmtError(f"{source / 'config.json'}: {key} {size!r}, where {name} holds {len(tokens):,} tokens")
    model_config = transformers_config(config, source)
    shared = bool(config["share_encoder_decoder_embeddings"])
    if shared and separate:
        raise NmtError(f"{source}: separate source and target vocabularies with shared embeddings")
    target = Side(tgt_tokens, *(_id(config, key, len(tgt_tokens), source) for key in (
        "pad_token_id", "decoder_start_token_id", "eos_token_id")), token_id(tgt_tokens, names["unk"], source))
    if target.start == target.eos:  # a decoder that starts from </s>'s row (nmt-cli's --decoder-start eos)
        model_config = model_config.replace(decoder_start="eos")
        target.start = start_of_eos_start(config, target, source)
    src_ids = [token_id(src_tokens, names[role], source) for role in ("pad", "eos", "unk")]
    if not separate and [target.pad, target.eos] != src_ids[:2]:
        raise NmtError(f"{source}: config.json's pad and eos ids differ from vocab.json's {names['pad']!r} and "
                       f"{names['eos']!r}")
    weights = transformers_weights(read_weights(source), model_config, shared, len(src_tokens), len(tgt_tokens),
                                   source)
    shared = "src_embed.tokens.weight" not in weights
    # The source side starts nothing: our <s> takes the row of the entry named as the target's start
    # (nmt-cli's exports: its own; OPUS-MT's: the pad), so an ordinary `<s>` (tc-big's) stays ordinary.
    name = tgt_tokens[target.start]
    start = src_tokens.index(name) if name in src_tokens else src_ids[0]
    src = target if shared else Side(src_tokens, src_ids[0], start, src_ids[1], src_ids[2])
    search, never = transformers_search(source, config, target, warn)
    langs = (str(tokenizer.get("source_lang") or "src"), str(tokenizer.get("target_lang") or "tgt"))
    return Release(model_config, weights, src, target, shared, marian_text(langs),
                   sentencepiece_file(source / "source.spm"), sentencepiece_file(source / "target.spm"), None, search,
                   never, f"transformers MarianMTModel ({source.name})", sines_then_cosines(model_config.d_model))


def vocabulary(path: Path) -> list[str]:
    """The tokens of a vocab.json ({token: id}) by id: every id from 0 up, once."""
    mapping = read_json(path)
    if not isinstance(mapping, dict) or not all(isinstance(i, int) for i in mapping.values()):
        raise NmtError(f"{path}: not a JSON object of token ids")
    return tokens_by_id(mapping, path)


def start_of_eos_start(config: dict[str, Any], target: Side, source: Path) -> int:
    """The row our <s> takes where the decoder starts from </s>: the release's bos_token_id, an entry
    of no other special role (its column is one of the softmax's, as in the release)."""
    start = _id(config, "bos_token_id", len(target.tokens), source)
    if start in (target.pad, target.eos, target.unk):
        raise NmtError(f"{source / 'config.json'}: its decoder starts from </s> and bos_token_id {start} is no "
                       "entry of its own: nmt-cli needs one for <s>")
    return start


def _id(config: dict[str, Any], key: str, size: int, source: Path) -> int:
    value = config.get(key)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, int) or not 0 <= value < size:
        raise NmtError(f"{source / 'config.json'}: {key} {value!r} is not an id of its {size:,}-token vocabulary")
    return value


def transformers_config(config: dict[str, Any], source: Path) -> ModelConfig:
    """Our ModelConfig of a MarianConfig, or a one-line refusal naming what ours cannot hold."""
    where = source / "config.json"
    for name, alias in (("encoder_layers", "num_hidden_layers"), ("d_model", "hidden_size"),
                        ("encoder_attention_heads", "num_attention_heads")):
        if alias in config and config[alias] != config[name]:
            raise NmtError(f"{where}: {name} {config[name]} and its alias {alias} {config[alias]} disagree")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config.get(a) != config.get(b):
            raise NmtError(f"{where}: {a} {config.get(a)} and {b} {config.get(b)}: nmt-cli's encoder and decoder "
                           "share that size")
    activation = config["activation_function"]
    if activation not in ACTIVATIONS:
        raise NmtError(f"{where}: activation_function {activation!r} (nmt-cli has {', '.join(ACTIVATIONS)})")
    try:
        return ModelConfig(
            encoder_layers=config["encoder_layers"], decoder_layers=config["decoder_layers"],
            d_model=config["d_model"], d_ff=config["encoder_ffn_dim"], heads=config["encoder_attention_heads"],
            dropout=config["dropout"], attention_dropout=config["attention_dropout"],
            relu_dropout=config["activation_dropout"], max_positions=config["max_position_embeddings"],
            activation=ACTIVATIONS[activation], scale_embeddings=bool(config["scale_embedding"]),
            tied_output=bool(config["tie_word_embeddings"]), output_bias=True)
    except KeyError as e:
        raise NmtError(f"{where}: no {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:
        raise NmtError(f"{where}: {e}") from None


def read_weights(source: Path) -> dict[str, Tensor]:
    """model.safetensors, or pytorch_model.bin read without running code from it; each tensor in
    memory of its own (importer.checkpoint_of lets each go once converted)."""
    path = source / "model.safetensors"
    if path.is_file():
        return safetensors_file(path)
    path = source / "pytorch_model.bin"
    if not path.is_file():
        raise NmtError(f"{source}: no model.safetensors or pytorch_model.bin")
    note_read(path)
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch's safe unpickler fails on garbage in many ways)
        raise unpickling_error(path, e, "a transformers model's weights") from None
    if not isinstance(weights, dict) or not all(isinstance(t, Tensor) for t in weights.values()):
        raise NmtError(f"{path}: not a dictionary of tensors")
    for name, tensor in weights.items():
        try:
            check_storage(tensor)
        except ValueError as e:
            raise NmtError(f"{path}: {name}: {e}") from None
    return weights


def transformers_weights(state: dict[str, Tensor], config: ModelConfig, shared: bool, src_size: int, tgt_size: int,
                         source: Path) -> dict[str, Tensor]:
    """MarianMTModel's weights under our names (Marian's layouts, the positions checked). Its
    embeddings are one matrix only if `shared` and they are equal: transformers 5 makes the
    encoder's, the decoder's and the output's matrices three without tie_word_embeddings."""
    state = {name.removeprefix("model."): tensor for name, tensor in state.items()}

    def take(*names: str, shape: tuple[int, ...] | None = None, keep: bool = False) -> Tensor:
        """The first of `names` the weights have, checked, and let go of unless `keep` (a layer's
        tensors are read once: its Q, K and V become one matrix without a second copy of them)."""
        for name in names:
            if name in state:
                tensor = state[name] if keep else state.pop(name)
                if shape is not None and tuple(tensor.shape) != shape:
                    raise NmtError(f"{source}: tensor {name} has shape {list(tensor.shape)}, the config needs "
                                   f"{list(shape)}")
                if not tensor.is_floating_point():
                    raise NmtError(f"{source}: tensor {name} is not floating point")
                return tensor
        raise NmtError(f"{source}: the weights have no {names[0]}")

    layers = {side: {int(m.group(1)) for name in state if (m := re.match(fr"{side}\.layers\.(\d+)\.", name))}
              for side in ("encoder", "decoder")}
    for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        if layers[side] != set(range(count)):
            raise NmtError(f"{source}: the weights hold {len(layers[side])} {side} layers, the config {count}")
    d = config.d_model
    def embedding(side: str, size: int) -> Tensor:
        names = (f"{side}.embed_tokens.weight", "shared.weight")
        return take(*(names[::-1] if shared and config.tied_output else names), shape=(size, d), keep=True)

    src, tgt = embedding("encoder", src_size), embedding("decoder", tgt_size)
    weights = {"tgt_embed.tokens.weight": tgt}
    if not shared or not torch.equal(src, tgt):
        weights["src_embed.tokens.weight"] = src
    if not config.tied_output:
        weights["output_projection.weight"] = take("lm_head.weight", shape=(tgt_size, d))
    weights["output_projection.bias"] = take("final_logits_bias", "lm_head.bias").reshape(-1)
    for side in ("encoder", "decoder"):
        stored = state.get(f"{side}.embed_positions.weight")
        if stored is not None:
            check_positions(stored, d, source / f"{side}.embed_positions.weight")
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            weights.update(layer_weights(take, side, i))
    return weights


def marian_sinusoid(length: int, d_model: int) -> Tensor:
    """Marian's positions as MarianMTModel and CTranslate2 make them: sines, then cosines."""
    return positional_encoding(length, d_model)[:, sines_then_cosines(d_model)]


def check_positions(stored: Tensor, d_model: int, where: Path) -> None:
    """Refuse stored positions other than the sinusoid (learned ones, another formula)."""
    expected = marian_sinusoid(stored.size(0), d_model)
    if stored.shape != expected.shape or not torch.allclose(stored.float(), expected, atol=1e-4):
        raise NmtError(f"{where}: positions that are not Marian's sinusoid (learned positions?); nmt-cli's "
                       "imported models have sinusoidal ones")


def transformers_search(source: Path, config: dict[str, Any], target: Side,
                        warn: Callable[[str], None]) -> tuple[dict[str, Any], list[str]]:
    """The search `generate()` runs with this release's settings (generation_config.json, or the
    ones older releases keep in config.json, which transformers 5 no longer reads): beam, length
    penalty (|Y|^alpha), stopping rule, length limit and how an output ends there, banned tokens,
    minimum length, n-gram and repetition controls."""
    path = source / "generation_config.json"
    generation = read_json(path) if path.is_file() else config
    where = path if path.is_file() else source / "config.json"
    if not isinstance(generation, dict):
        raise NmtError(f"{where}: not a JSON object of settings")
    early = generation.get("early_stopping", False)
    if early not in (True, False, "never"):
        raise NmtError(f"{where}: early_stopping {early!r}: expected true, false or 'never'")
    if early == "never":
        warn(f"warning: {where}: early_stopping 'never' is searched with transformers' default rule (False)")
    # generate() stops at max_length tokens counting the start (or after max_new_tokens), and with
    # forced_eos_token_id (MarianConfig's default) the last of them is </s>: ours comes after the limit.
    new_tokens = setting(generation, "max_new_tokens", int, None, where, low=1)
    limit = new_tokens if new_tokens is not None else setting(generation, "max_length", int, 20, where, low=1) - 1
    forced = generation.get("forced_eos_token_id")
    forces_eos = (forced[0] if isinstance(forced, list) and forced else forced) == target.eos
    limit -= forces_eos
    ignored = [key for key, default in (("do_sample", False), ("forced_bos_token_id", None), ("num_beam_groups", 1))
               if generation.get(key, default) not in (default, None)]
    if ignored:
        warn(f"warning: {where}: {', '.join(ignored)} not carried over (nmt-cli's search has no such option yet)")
    never, allow_unk = banned(generation, target, where, warn)
    # min_length counts the start token, min_new_tokens does not (the later wins in generate(), as here)
    min_len = max(setting(generation, "min_length", int, 0, where, low=0) - 1,
                  setting(generation, "min_new_tokens", int, 0, where, low=0), 0)
    search = {"beam": setting(generation, "num_beams", int, 1, where, low=1),
              "lenpen": float(setting(generation, "length_penalty", float, 1.0, where)), "lenpen_form": "length",
              "stopping": "early" if early is True else "heuristic", "at_limit": "free" if forces_eos else "cut",
              "max_len_a": 0.0, "max_len_b": max(limit, 1),
              "allow_unk": allow_unk, "min_len": min_len,
              "no_repeat_ngram_size": setting(generation, "no_repeat_ngram_size", int, 0, where, low=0),
              "repetition_penalty": float(setting(generation, "repetition_penalty", float, 1.0, where))}
    try:
        SearchConfig(**search)
    except ValueError as e:
        raise NmtError(f"{where}: {e}") from None
    return search, never


def banned(generation: dict[str, Any], target: Side, where: Path, warn: Callable[[str], None]
           ) -> tuple[list[str], bool]:
    """The tokens `bad_words_ids` bans (a list of lists of token ids; single tokens are carried
    over, longer phrases warned of), and whether <unk> may be output."""
    entries = generation.get("bad_words_ids") or []
    if not isinstance(entries, list) or not all(
            isinstance(entry, list) and entry and all(type(i) is int and 0 <= i < len(target.tokens) for i in entry)
            for entry in entries):
        raise NmtError(f"{where}: bad_words_ids {str(entries)[:100]}: expected lists of ids of its "
                       f"{len(target.tokens):,}-token vocabulary")
    never, allow_unk = [], True
    for entry in entries:
        if len(entry) > 1:
            warn(f"warning: {where}: bad_words_ids entry {entry} not carried over (only single tokens are)")
        elif entry[0] == target.unk:
            allow_unk = False
        elif entry[0] not in (target.pad, target.start, target.eos):  # our search never outputs those anyway
            never.append(target.tokens[entry[0]])
    return never, allow_unk
