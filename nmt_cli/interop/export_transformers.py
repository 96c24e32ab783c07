"""`nmt export --format transformers`: the model as Hugging Face transformers' `MarianMTModel`, with a
`MarianTokenizer` and a model card, so that `AutoModelForSeq2SeqLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` (and the tools built on them) translate as `nmt translate` does.

Marian's layers are ours (post-norm, relu or another activation, sinusoidal positions with the
paper's frequencies, embeddings scaled by sqrt(d_model), an output projection tied or not, with a
bias or not), except that it lays a position's
sinusoid out as all sines, then all cosines, where §3.5 (and we) interleave them. Permuting the
d_model dimensions of the whole residual stream the same way (every weight that reads it or
writes it, every layer norm, the embeddings) gives a network that computes exactly ours: the
permutation commutes with the layer norms and cancels in every projection.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.decode.controls import banned_ids
from nmt_cli.errors import NmtError
from nmt_cli.interop.card import UNSET_LICENCE, CardConfig, Evaluation, model_card
from nmt_cli.interop.release import sines_then_cosines
from nmt_cli.interop.writing import text_files, write_export
from nmt_cli.model.checkpoint import ModelBundle, bundle_of, load
from nmt_cli.model.transformer import MultiHeadAttention, SublayerConnection, Transformer
from nmt_cli.text.vocab import BOS, BOS_ID, EOS_ID, PAD_ID, SPECIALS, start_row

if TYPE_CHECKING:
    from nmt_cli.interop.exporter import ExportRequest


def export(request: ExportRequest) -> None:
    """`nmt export --format transformers`, with the model card's options and --eval."""
    from nmt_cli.interop.card import evaluate

    save_transformers(load(request.model), request.model, request.output, request.card,
                      [evaluate(request.model, *pair) for pair in request.evaluations])


def save_transformers(checkpoint: dict[str, Any], source: Path, out: Path, card: CardConfig = CardConfig(),
                      evaluations: Sequence[Evaluation] = ()) -> None:
    """A transformers model directory of `checkpoint` (read from `source`), with a model card of
    what it records, its licence `card`, and the scores of `evaluations`."""
    try:
        from transformers import GenerationConfig, MarianConfig, MarianMTModel
    except ImportError:
        raise NmtError("--format transformers needs transformers: pip install 'nmt-cli[export]' "
                       "(or pip install transformers)") from None
    bundle = bundle_of(checkpoint, source)
    check_marian(bundle)
    marian = MarianMTModel(marian_config(MarianConfig, bundle)).eval()
    marian.generation_config = generation_config(GenerationConfig, bundle)
    state = marian_weights(bundle.model, bundle.shared)
    missing = set(marian.state_dict()) - set(state) - {"model.encoder.embed_positions.weight",
                                                         "model.decoder.embed_positions.weight"}
    assert not missing, missing  # every weight of the Marian model is set
    marian.load_state_dict(state, strict=False)

    def write(tmp: Path) -> None:
        from safetensors import SafetensorError
        from transformers.utils import logging

        bar = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # our output is one line, not a bar of shards
        try:
            marian.save_pretrained(str(tmp))
        except SafetensorError as e:  # its writer's I/O error (a full disk, a file-size limit), as an OSError
            errno = next((int(n) for n in re.findall(r"os error (\d+)", str(e))), 0)
            raise OSError(errno, os.strerror(errno) if errno else str(e)) from None
        finally:
            if bar:
                logging.enable_progress_bar()
        # transformers writes the weights readable by their owner alone: as readable as its config
        (tmp / "model.safetensors").chmod((tmp / "config.json").stat().st_mode & 0o777)
        _tokenizer_files(bundle, tmp)
        text_files(bundle, tmp)
        note = search_note(bundle, SearchConfig(**bundle.released.search))
        (tmp / "README.md").write_text(model_card(bundle, checkpoint, source.name, note, card, list(evaluations)),
                                       encoding="utf-8")
        if card.license == "other" and card.license_link == "LICENSE":
            (tmp / "LICENSE").write_text(UNSET_LICENCE, encoding="utf-8")

    write_export(out, write)


def check_marian(bundle: ModelBundle) -> None:
    """Refuse, in one line with the reason, a model or text pipeline that Marian cannot hold."""
    config, text = bundle.model.config, bundle.text
    reasons = [(config.norm == "pre", "a pre-norm model (MarianMTModel's layers are post-norm)"),
               (config.positions == "learned", "learned positions (Marian's are sinusoidal)"),
               (config.embedding_norm, "a layer norm on the embeddings"),
               (not config.source_eos, "a model of sources without </s> (MarianTokenizer ends each with one)"),
               (config.d_k != config.d_model // config.heads or config.d_v != config.d_k,
                f"d_k {config.d_k} and d_v {config.d_v} (Marian's heads are d_model / heads = "
                f"{config.d_model // config.heads} wide)"),
               (config.d_model % 2 == 1, "an odd d_model")]
    for cannot, what in reasons:
        if cannot:
            raise NmtError(f"--format transformers: MarianMTModel cannot hold {what}")
    if not text.sentencepiece:
        words = "Moses tokenization" if text.tokenizer == "moses" else "whitespace tokens"
        raise NmtError(f"--format transformers: MarianTokenizer holds only SentencePiece models, and this one reads "
                       f"{words}{' and BPE' if bundle.bpe_codes else ''}; train on `nmt preprocess --subword "
                       "sentencepiece` data to export to transformers")
    if text.lowercase:
        raise NmtError("--format transformers: MarianTokenizer does not lowercase; train without --lowercase")


def marian_config(config_class: Any, bundle: ModelBundle) -> Any:
    """Marian's description of our network: its sizes, post-norm layers and their activation,
    the embeddings (scaled or not, tied to the output projection or not), and our special ids."""
    config = bundle.model.config
    return config_class(
        vocab_size=len(bundle.src_vocab), decoder_vocab_size=len(bundle.tgt_vocab),
        share_encoder_decoder_embeddings=bundle.shared, d_model=config.d_model, encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers, encoder_attention_heads=config.heads,
        decoder_attention_heads=config.heads, encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff,
        max_position_embeddings=config.max_positions, scale_embedding=config.scale_embeddings,
        activation_function=HF_ACTIVATIONS[config.activation],
        dropout=config.dropout, attention_dropout=config.attention_dropout, activation_dropout=config.relu_dropout,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        decoder_start_token_id=start_row(config.decoder_start),
        forced_eos_token_id=forced_eos(SearchConfig(**bundle.released.search)), tie_word_embeddings=config.tied_output)


def forced_eos(search: SearchConfig) -> int | None:
    """</s> at the length limit, as generate() forces it (`--at-limit free`, and `scored`, which it
    cannot express), or none: an output cut at the limit (`--at-limit cut`, a release's without)."""
    return None if search.at_limit == "cut" else EOS_ID


def generate_limit(bundle: ModelBundle, search: SearchConfig) -> int:
    """The most tokens `generate` outputs before its forced </s>: ours where it does not grow with
    the source, else the model's positions."""
    positions = bundle.model.config.max_positions - 1
    return min(search.max_len_b, positions) if search.max_len_a == 0 else positions


def search_note(bundle: ModelBundle, search: SearchConfig) -> str:
    """The card's words on how `generate` and `nmt translate` search, and precisely where they differ."""
    limit = generate_limit(bundle, search)
    form = ("both dividing a hypothesis' score by |Y|^alpha" if search.lenpen_form == "length" else
            "but transformers divides a hypothesis' score by |Y|^alpha where nmt-cli divides it by ((5 + |Y|) / "
            "6)^alpha (GNMT): `nmt translate --lenpen-form length` searches as `generate` does")
    if search.max_len_a == 0:
        length = f"Both stop an output after {limit} tokens, so greedy search (`num_beams=1`) gives nmt-cli's " \
                 "translations exactly."
    else:
        length = (f"`generate` stops an output after {limit} tokens, `nmt translate` after {search.max_len_a:g} x "
                  f"its source's tokens + {search.max_len_b}: greedy search (`num_beams=1`) gives nmt-cli's "
                  "translations exactly where neither limit is reached (`generate(max_new_tokens=N)` and `nmt "
                  "translate --max-len-a 0 --max-len-b N` make the limits one).")
    return (f"`generate` searches as `nmt translate` does by default (beam {search.beam}, length penalty alpha "
            f"{search.lenpen}, early_stopping {search.stopping == 'early'}), {form}. {length}")


# Our FFN activations by transformers' names.
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu-tanh": "gelu_new", "gelu-sigmoid": "quick_gelu",
                  "swish": "swish"}


def generation_config(config_class: Any, bundle: ModelBundle) -> Any:
    """`generate`'s defaults as `nmt translate`'s (`translator.model_search`): start where ours does, never
    output what our search never outputs, at most our length limit of tokens and then </s>
    (transformers' max_length counts the start, and the forced </s> unless an output is cut at the
    limit: a limit that grows with the source is taken at max_positions - 1), our beam size, our
    stopping rule, our length penalty's alpha
    (which transformers applies as |Y|^alpha), and our minimum length, n-gram and repetition controls."""
    search = SearchConfig(**bundle.released.search)
    banned = banned_ids(search, bundle.never)
    return config_class(
        decoder_start_token_id=start_row(bundle.model.config.decoder_start), bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, forced_eos_token_id=forced_eos(search),
        max_length=generate_limit(bundle, search) + 1 + (forced_eos(search) is not None),
        num_beams=search.beam, length_penalty=search.lenpen, early_stopping=search.stopping == "early",
        bad_words_ids=[[i] for i in banned], min_new_tokens=search.min_len or None,
        no_repeat_ngram_size=search.no_repeat_ngram_size, repetition_penalty=search.repetition_penalty)


def marian_weights(model: Transformer, shared: bool) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, the residual stream's dimensions permuted."""
    order = sines_then_cosines(model.config.d_model)
    state: dict[str, torch.Tensor] = {}

    def put(name: str, tensor: torch.Tensor) -> None:
        state[name] = _copy(tensor)

    tgt = model.tgt_embed.tokens.weight[:, order]
    put("model.decoder.embed_tokens.weight", tgt)
    put("lm_head.weight", model.output_projection.weight[:, order])
    put("model.encoder.embed_tokens.weight", model.src_embed.tokens.weight[:, order])
    if shared:
        put("model.shared.weight", tgt)
    bias = model.output_projection.bias
    put("final_logits_bias", (bias if bias is not None else torch.zeros(tgt.size(0))).unsqueeze(0))
    for side, layers in (("encoder", model.encoder_layers), ("decoder", model.decoder_layers)):
        for i, layer in enumerate(layers):
            prefix = f"model.{side}.layers.{i}."
            attentions = [("self_attn", layer.self_attn)] + ([("encoder_attn", layer.cross_attn)]
                                                            if side == "decoder" else [])
            norms = ["self_attn_layer_norm"] + (["encoder_attn_layer_norm"] if side == "decoder" else [])
            for (name, attention), norm, sublayer in zip(attentions, norms, layer.sublayers):
                state.update(_attention(prefix + name, attention, order))
                state.update(_norm(prefix + norm, sublayer, order))
            put(prefix + "fc1.weight", layer.ffn.w1.weight[:, order])
            put(prefix + "fc1.bias", layer.ffn.w1.bias)
            put(prefix + "fc2.weight", layer.ffn.w2.weight[order])
            put(prefix + "fc2.bias", layer.ffn.w2.bias[order])
            state.update(_norm(prefix + "final_layer_norm", layer.sublayers[-1], order))
    return state


def _attention(prefix: str, attention: MultiHeadAttention, order: torch.Tensor) -> dict[str, torch.Tensor]:
    """Q, K, V (split from our fused matrices; they read the residual stream) and W^O (writes it)."""
    if hasattr(attention, "qkv"):
        weights, biases = attention.qkv.weight.split(attention.heads * attention.d_k), \
            attention.qkv.bias.split(attention.heads * attention.d_k)
    else:
        k, v = attention.kv.weight.split(attention.heads * attention.d_k), \
            attention.kv.bias.split(attention.heads * attention.d_k)
        weights, biases = (attention.q.weight, *k), (attention.q.bias, *v)
    out = {}
    for name, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases):
        out[f"{prefix}.{name}.weight"], out[f"{prefix}.{name}.bias"] = _copy(weight[:, order]), _copy(bias)
    out[f"{prefix}.out_proj.weight"] = _copy(attention.out.weight[order])
    out[f"{prefix}.out_proj.bias"] = _copy(attention.out.bias[order])
    return out


def _norm(prefix: str, sublayer: SublayerConnection, order: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": _copy(sublayer.norm.weight[order]), f"{prefix}.bias": _copy(sublayer.norm.bias[order])}


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 tensor of its own (Marian's weights are not views of ours)."""
    return tensor.detach().float().clone()


def _tokenizer_files(bundle: ModelBundle, out: Path) -> None:
    """MarianTokenizer's files: the SentencePiece model for each side and the pieces' ids (ours)."""
    assert bundle.sentencepiece is not None
    for name, side in (("source.spm", "source"), ("target.spm", "target")):
        (out / name).write_bytes(bundle.pieces(side))
    vocabularies = [("vocab.json", bundle.src_vocab)]
    if not bundle.shared:
        vocabularies.append(("target_vocab.json", bundle.tgt_vocab))
    for name, vocab in vocabularies:
        tokens = list(vocab.tokens)  # the fillers too: as many as the model's rows
        if BOS in tokens[len(SPECIALS):]:  # an ordinary <s> (tc-big's) keeps its name; our start, only a row, another
            tokens[BOS_ID] = next(f"<start{n or ''}>" for n in itertools.count() if f"<start{n or ''}>" not in tokens)
        ids = {token: i for i, token in enumerate(tokens)}
        (out / name).write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
    text = bundle.text
    config = {"tokenizer_class": "MarianTokenizer", "source_lang": text.source_lang, "target_lang": text.target_lang,
              "separate_vocabs": not bundle.shared, "model_max_length": bundle.model.config.max_positions,
              "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
