"""fairseq checkpoints (fairseq 0.12's `transformer` family: `transformer`, `transformer_wmt_en_de`,
`transformer_vaswani_wmt_en_de_big`, `transformer_iwslt_de_en`, ...) read into a `Release`, without
running pickled code: an allow-list of what such checkpoints hold (argparse.Namespace, tensors,
the containers), anything else refused in one line.

fairseq's Transformer is ours (§3) up to three layouts, which the import undoes exactly:
- its sinusoid is tensor2tensor's (log(10000) / (d/2 - 1) between frequencies, sines then
  cosines) and a sequence's first position is row padding_idx + 1 = 2: the table, or a learned
  one, becomes the model's learned positions, from that row on;
- its dictionaries put <s> 0, <pad> 1, </s> 2, <unk> 3, and the decoder starts from </s>: its rows
  become ours in our order, and the model starts from </s>'s row (ModelConfig.decoder_start), so
  that its softmax runs over the same rows as fairseq's;
- its output projection has no bias.
What ours cannot hold (an embedding layer norm, adaptive softmax or input, ...) is refused in
one line naming the option. The search settings are fairseq-generate's (`--lenpen` over the
hypothesis' length, the beam's stopping rule, `max_len_a/b`, `min_len` 1).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.errors import NmtError
from nmt_cli.interop.reading import read_codes, sentencepiece_file, setting, text_file
from nmt_cli.interop.release import Release, Side, check_rows, layer_weights, peer_text
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.run_config import ImportConfig
from nmt_cli.text.vocab import Vocabulary

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0 to 3 of a fairseq Dictionary
ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}
# Options fairseq's Transformer may set that ours cannot hold: each refused where it is on.
UNSUPPORTED = {"adaptive_input": "adaptive input",
               "no_token_positional_embeddings": "no positions at all", "cross_self_attention": "cross+self-attention",
               "no_cross_attention": "no encoder-decoder attention", "adaptive_softmax_cutoff": "adaptive softmax",
               "quant_noise_pq": "quantization noise", "encoder_layers_to_keep": "pruned layers",
               "decoder_layers_to_keep": "pruned layers", "no_decoder_final_norm": "a pre-norm decoder without "
               "its final norm"}


def read_fairseq(path: Path, state: dict[str, Any], given: ImportConfig) -> Release:
    """A fairseq checkpoint (its `state`, as reading.load_pickled reads it) with its dictionaries
    (`given.data_dir`, default: the checkpoint's folder, then the data path its configuration
    names), languages and text pipeline."""
    if not isinstance(state.get("model"), dict):
        raise NmtError(f"{path}: not a fairseq checkpoint (no 'model' dictionary of tensors)")
    options, task, generation = settings(state, path)
    langs = (given.source_lang or task.get("source_lang"), given.target_lang or task.get("target_lang"))
    folder = dictionary_folder(path, given.data_dir, task.get("data"), langs)
    if None in langs:
        raise NmtError(f"{path}: its configuration names no languages: give -s SRC -t TGT (the suffixes of "
                       f"{folder}/dict.SRC.txt and dict.TGT.txt)")
    tokens = [fairseq_dictionary(folder / f"dict.{lang}.txt") for lang in langs]
    config, shared, tied = fairseq_config(options, path)
    weights = fairseq_weights(state["model"], config, shared, tied, path)
    check_rows(weights, shared, (tokens[0], tokens[1]), tuple(f"{folder / f'dict.{lang}.txt'} (with fairseq's 4 "
                                                              "specials)" for lang in langs))
    target = Side(tokens[1], pad=1, start=0, eos=2, unk=3)
    source = target if shared else Side(tokens[0], pad=1, start=0, eos=2, unk=3)
    search = fairseq_search(generation, path)
    origin = f"fairseq ({path.name})"
    if given.sentencepiece is not None:
        pieces = sentencepiece_file(given.sentencepiece)
        return Release(config, weights, source, target, shared, peer_text(langs, given.tokenizer, True, "fairseq"),
                       pieces, pieces, search=search, origin=origin)
    # fairseq-interactive's `--tokenizer moses`: sacremoses without punctuation normalization
    text = peer_text(langs, given.tokenizer or "moses", False, "fairseq", fairseq_moses=True)
    codes = read_codes(given.bpe_codes) if given.bpe_codes is not None else None
    return Release(config, weights, source, target, shared, text, bpe_codes=codes, search=search, origin=origin)


def settings(state: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The model's options, the task's and the generation's: from `cfg` (fairseq >= 0.10) or `args`."""
    def plain(value: Any) -> dict[str, Any]:
        return vars(value) if isinstance(value, argparse.Namespace) else value if isinstance(value, dict) else {}

    cfg = state.get("cfg")
    if isinstance(cfg, dict) and cfg.get("model") is not None:
        return plain(cfg["model"]), plain(cfg.get("task")), plain(cfg.get("generation"))
    args = plain(state.get("args"))
    if not args:
        raise NmtError(f"{path}: no model options (neither cfg nor args): not a fairseq checkpoint")
    return args, args, args


def dictionary_folder(path: Path, data_dir: Path | None, data: Any, langs: tuple[str | None, str | None]) -> Path:
    """Where dict.SRC.txt and dict.TGT.txt are: --data-dir, else the checkpoint's folder, else the
    data path of its configuration (its first, where it lists several)."""
    if data_dir is not None:
        return data_dir
    candidates = [path.parent] + ([Path(str(data).split(":")[0])] if data else [])
    for folder in candidates:
        if all(lang is None or (folder / f"dict.{lang}.txt").is_file() for lang in langs) and \
                any(folder.glob("dict.*.txt")):
            return folder
    raise NmtError(f"{path}: no dict.SRC.txt and dict.TGT.txt beside it or in {candidates[-1]}: give --data-dir")


def fairseq_dictionary(path: Path) -> list[str]:
    """The tokens of a fairseq dict.txt by id: its four specials, then its `token count` lines
    (fairseq's flags after the count, `#fairseq:overwrite`, allowed)."""
    if not path.is_file():
        raise NmtError(f"{path}: missing (the dictionaries of the checkpoint's data)")
    lines = text_file(path, "a fairseq dictionary").splitlines()
    text = "\n".join(" ".join(line.split(" ")[:2]) for line in lines)
    return list(FAIRSEQ_SPECIALS) + Vocabulary.from_text(text, str(path)).tokens[4:]


def fairseq_config(options: dict[str, Any], path: Path) -> tuple[ModelConfig, bool, bool]:
    """Our ModelConfig of fairseq's options, whether all embeddings are one, whether the output
    projection is the decoder's embedding; a one-line refusal naming what ours cannot hold."""
    arch = str(options.get("arch") or options.get("_name") or "transformer")
    if not arch.startswith("transformer") or arch.startswith(("transformer_lm", "transformer_align")):
        raise NmtError(f"{path}: --arch {arch}: nmt-cli imports fairseq's encoder-decoder transformer family "
                       "(transformer, transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big, ...)")
    for name, what in UNSUPPORTED.items():
        if options.get(name):
            raise NmtError(f"{path}: --{name.replace('_', '-')} {options[name]!r}: {what}, which nmt-cli's model "
                           "does not have")
    pairs = [("encoder_embed_dim", "decoder_embed_dim"), ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
             ("encoder_attention_heads", "decoder_attention_heads"),
             ("encoder_normalize_before", "decoder_normalize_before"), ("encoder_learned_pos", "decoder_learned_pos")]
    for a, b in pairs:
        if bool(options.get(a)) != bool(options.get(b)) or options.get(a) != options.get(b):
            raise NmtError(f"{path}: --{a.replace('_', '-')} {options.get(a)} and --{b.replace('_', '-')} "
                           f"{options.get(b)}: nmt-cli's encoder and decoder share that setting")
    activation = options.get("activation_fn", "relu")
    if activation not in ACTIVATIONS:
        raise NmtError(f"{path}: --activation-fn {activation!r} (nmt-cli has {', '.join(ACTIVATIONS)})")
    shared = bool(options.get("share_all_embeddings"))
    tied = shared or bool(options.get("share_decoder_input_output_embed"))
    try:
        config = ModelConfig(
            encoder_layers=options["encoder_layers"], decoder_layers=options["decoder_layers"],
            d_model=options["encoder_embed_dim"], d_ff=options["encoder_ffn_embed_dim"],
            heads=options["encoder_attention_heads"], dropout=float(options.get("dropout", 0.1)),
            attention_dropout=float(options.get("attention_dropout", 0.0)),
            relu_dropout=float(options.get("activation_dropout", options.get("relu_dropout", 0.0))),
            label_smoothing=0.1, positions="learned",
            max_positions=min(options.get("max_source_positions", 1024), options.get("max_target_positions", 1024)),
            activation=ACTIVATIONS[activation], norm="pre" if options.get("encoder_normalize_before") else "post",
            scale_embeddings=not options.get("no_scale_embedding"), tied_output=tied, output_bias=False,
            decoder_start="eos", embedding_norm=bool(options.get("layernorm_embedding")))
    except KeyError as e:
        raise NmtError(f"{path}: its options have no {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:
        raise NmtError(f"{path}: {e}") from None
    return config, shared, tied


def fairseq_sinusoid(rows: int, d_model: int) -> Tensor:
    """fairseq's (tensor2tensor's) sinusoidal table: sines then cosines, the frequencies spaced by
    log(10000) / (d/2 - 1) (the paper's: by log(10000) / (d/2))."""
    half = d_model // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.float)[:, None] * frequencies[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return torch.cat([table, torch.zeros(rows, d_model % 2)], dim=1)


def fairseq_weights(state: dict[str, Tensor], config: ModelConfig, shared: bool, tied: bool,
                    path: Path) -> dict[str, Tensor]:
    """fairseq's weights under our names (rows in its dictionaries' ids), each checked to exist."""
    def take(name: str) -> Tensor:
        if not isinstance(state.get(name), Tensor) or not state[name].is_floating_point():
            raise NmtError(f"{path}: the weights have no tensor {name}")
        return state[name]

    first = 2  # padding_idx + 1: the row of a sequence's first position
    weights: dict[str, Tensor] = {"tgt_embed.tokens.weight": take("decoder.embed_tokens.weight")}
    if not shared:
        weights["src_embed.tokens.weight"] = take("encoder.embed_tokens.weight")
    if not tied:
        weights["output_projection.weight"] = take("decoder.output_projection.weight")
    for side, ours in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        learned = state.get(f"{side}.embed_positions.weight")
        table = learned if learned is not None else fairseq_sinusoid(first + config.max_positions, config.d_model)
        if table.size(0) < first + config.max_positions:
            raise NmtError(f"{path}: {side}.embed_positions.weight has {table.size(0)} rows, fewer than "
                           f"{first + config.max_positions}")
        weights[f"{ours}.learned.weight"] = table[first:first + config.max_positions].float()
        if config.embedding_norm:  # --layernorm-embedding
            for kind in ("weight", "bias"):
                weights[f"{ours}.norm.{kind}"] = take(f"{side}.layernorm_embedding.{kind}")
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            weights.update(layer_weights(take, side, i))
        if config.norm == "pre":
            for kind in ("weight", "bias"):
                weights[f"{side}_norm.{kind}"] = take(f"{side}.layer_norm.{kind}")
    return weights


def fairseq_search(generation: dict[str, Any], path: Path) -> dict[str, Any]:
    """fairseq-generate's search: beam 5, its score over the hypothesis' length to the --lenpen,
    finished when the beam has as many hypotheses, at most max_len_a x source + max_len_b tokens,
    no </s> first (min_len 1)."""
    def given(key: str, kind: type, default: Any, low: float) -> Any:
        return setting(generation, key, kind, default, path, low)

    return {"beam": given("beam", int, 5, 1), "lenpen": float(given("lenpen", float, 1.0, 0)),
            "lenpen_form": "length", "stopping": "early", "max_len_a": float(given("max_len_a", float, 0.0, 0)),
            "max_len_b": given("max_len_b", int, 200, 0), "min_len": given("min_len", int, 1, 0) or 1,
            "allow_unk": not generation.get("unkpen")}
