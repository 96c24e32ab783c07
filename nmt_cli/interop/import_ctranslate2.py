"""CTranslate2 model directories read into a `Release`, so that a model that exists only for
CTranslate2 (an Argos Translate package's, or what its converters made of an OpenNMT-py, fairseq,
Marian or transformers model) trains again: `model.bin` (model_bin.py), `config.json` (CTranslate2's
own: its special tokens, whether a source gets </s>, the layer norms' epsilon), the vocabularies
(`shared_vocabulary.json`, or `source_`/`target_vocabulary.json`, or their .txt forms), and the
text pipeline from the files beside the model or the options given.

CTranslate2's `TransformerSpec` is ours up to layouts the import undoes exactly:
- Q, K and V are one matrix in self-attention, K and V one in encoder-decoder attention (as ours);
  a bias CTranslate2 did not store is zeros;
- its position tables are read as ours where they are ours (§3.5's sinusoid, interleaved or with
  the sines first, Marian's layout: `Release.order`), else kept as learned positions (fairseq's);
- a decoder that starts from a zero vector (Marian's) starts from a zero row of our <s>;
- a source gets </s> where its config says so or its decoder starts from another token than <s>
  (fairseq's </s>, Marian's <pad>: their tokenizers end every source with </s>).
A layer norm on the embeddings (BART's, mBART's) is ours with `embedding_norm`. What ours cannot
hold (relative or rotary positions, RMS norms, gated FFNs, source features, another activation)
is refused in one line naming the variable; so
is a model.bin of another kind (Whisper, a decoder-only language model), naming its spec.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.interop.export_argos import ARGOS_MOSES
from nmt_cli.interop.model_bin import ModelBin, read_model_bin
from nmt_cli.interop.reading import read_codes, read_json, sentencepiece_file, text_file, token_id
from nmt_cli.interop.release import Release, Side, marian_text, peer_text, sines_then_cosines
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.model.transformer import positional_encoding
from nmt_cli.run_config import ImportConfig

SPECS = {"TransformerSpec": None, "TransformerBase": 8, "TransformerBig": 16}  # their heads, where not stored
ACTIVATIONS = {0: "relu", 1: "gelu-tanh", 2: "swish", 3: "gelu", 4: "gelu-sigmoid"}  # common_spec.Activation
# Scalars of the spec and the values ours can hold (absent: CTranslate2's default, which ours is).
FLAGS = {"with_relative_position": 0, "embeddings_merge": 0, "alibi": 0,
         "alibi_use_positive_positions": 0, "scale_alibi": 0, "multi_query_attention": 0}
# What a variable ours has no place for is, by a part of its name.
UNHELD = {"relative": "relative positions", "linear_0_noact": "a gated FFN", "embeddings_1": "source features",
          "rotary": "rotary positions", "project_in": "projections around the decoder"}
# translate_batch's defaults, the search a CTranslate2 model runs where nothing else says.
CTRANSLATE2_SEARCH = {"beam": 2, "lenpen": 1.0, "lenpen_form": "length", "stopping": "early", "at_limit": "cut",
                      "max_len_a": 0.0, "max_len_b": 256, "min_len": 1, "allow_unk": True}
LAYER_NORM_EPSILON = 1e-5  # CTranslate2's where config.json does not say (its converter of Marian's models)
POSITION_TOLERANCE = 5e-4  # a sinusoid computed elsewhere in float32 differs from ours by rounding alone


def read_ctranslate2(source: Path, options: ImportConfig, warn: Callable[[str], None]) -> Release:
    """A CTranslate2 model directory, its text pipeline from the files in it or `options`."""
    return ctranslate2_release(source, source, options, warn, (options.source_lang, options.target_lang),
                               f"CTranslate2 ({source.name})")


def ctranslate2_release(folder: Path, text_folder: Path, options: ImportConfig, warn: Callable[[str], None],
                        langs: tuple[str | None, str | None], origin: str,
                        search: dict[str, Any] | None = None) -> Release:
    """The model in `folder`, its text pipeline from `text_folder`'s files (or `options`), for
    `langs`; `search`: the settings it runs with (default: an export of ours, its own; another
    model, translate_batch's defaults)."""
    model = read_model_bin(folder / "model.bin")
    heads = check_spec(model, folder / "model.bin")
    settings = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if not isinstance(settings, dict) or "model_type" in settings or "architectures" in settings:
        raise NmtError(f"{folder / 'config.json'}: not CTranslate2's config.json (a transformers one?) beside "
                       "model.bin")
    about = read_json(folder / "nmt-cli.json") if (folder / "nmt-cli.json").is_file() else {}
    src_tokens, tgt_tokens = vocabularies(folder)
    names = {role: str(settings.get(f"{role}_token") or default)
             for role, default in (("bos", "<s>"), ("eos", "</s>"), ("unk", "<unk>"))}
    start = settings.get("decoder_start_token") or names["bos"]
    if settings.get("add_source_bos"):
        raise NmtError(f"{folder / 'config.json'}: add_source_bos: nmt-cli's sources do not start with <s>")
    config, order = architecture(model, heads, settings, about, start != names["bos"], folder)
    if config.positions == "learned":
        warn(f"note: {folder / 'model.bin'}: its position table is not a sinusoid of nmt-cli's: kept as learned "
             "positions, which fine-tuning trains")
    weights = ct2_weights(model, config)
    zero_start = bool(scalar(model, "decoder/start_from_zero_embedding", 0))
    shared = src_tokens == tgt_tokens and model.same(source_embedding(model), "decoder/embeddings/weight")
    target = special_rows(tgt_tokens, names, names["bos"] if start == names["eos"] else start, zero_start, folder)
    source = target if shared else special_rows(src_tokens, names, names["bos"], False, folder)
    grow_rows(weights, (source, target))
    if start == names["eos"] and not zero_start:  # (a zero start's token is any: Marian's converted)
        config = config.replace(decoder_start="eos")
    text, pieces, codes, read = text_pipeline(folder, text_folder, options, langs, about)
    warn(f"note: the text pipeline: {read}")
    released = about.get("released") if isinstance(about.get("released"), dict) else {}
    never = list(released.get("never_output") or [])
    if search is None:  # an export of ours searches as it did (nmt-cli's defaults), another as CTranslate2
        search = dict(released.get("search") or {}) if about else dict(CTRANSLATE2_SEARCH)
    return Release(config, weights, source, target, shared, text, pieces[0], pieces[1], codes, search, never, origin,
                   order)


def check_spec(model: ModelBin, path: Path) -> int | None:
    """Refuse a model.bin that is not CTranslate2's encoder-decoder Transformer, or holds what ours
    cannot; its heads where the spec does not store them."""
    if model.spec not in SPECS:
        raise NmtError(f"{path}: a {model.spec or 'nameless spec'}; nmt import reads CTranslate2's encoder-decoder "
                       "Transformer (TransformerSpec)")
    for name, tensor in model.variables.items():
        key = name.rsplit("/", 1)[-1]
        if tensor.dim() == 0 and key in FLAGS and int(tensor) != FLAGS[key]:
            raise NmtError(f"{path}: {name} is {int(tensor)}, which nmt-cli's Transformer does not have")
    return SPECS[model.spec]


def scalar(model: ModelBin, name: str, default: float) -> float:
    value = model.get(name)
    return default if value is None else float(value)


def vocabularies(folder: Path) -> tuple[list[str], list[str]]:
    """The source and the target tokens by id (one list for a shared vocabulary)."""
    for names in (("shared_vocabulary",), ("source_vocabulary", "target_vocabulary")):
        for suffix in (".json", ".txt"):
            paths = [folder / (name + suffix) for name in names]
            if all(p.is_file() for p in paths):
                tokens = [vocabulary(p) for p in paths]
                return tokens[0], tokens[-1]
    raise NmtError(f"{folder}: no shared_vocabulary.json, nor source_vocabulary.json and target_vocabulary.json "
                   "(CTranslate2's vocabularies)")


def vocabulary(path: Path) -> list[str]:
    """A vocabulary file's tokens: a JSON list, or (older versions) a token a line."""
    if path.suffix == ".txt":
        return text_file(path, "a vocabulary").splitlines()
    tokens = read_json(path)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise NmtError(f"{path}: not a JSON list of tokens")
    return tokens


def architecture(model: ModelBin, heads: int | None, settings: dict[str, Any], about: dict[str, Any],
                 other_start: bool, folder: Path) -> tuple[ModelConfig, Tensor | None]:
    """Our ModelConfig of the spec's variables (and of nmt-cli.json's, where an export of ours says
    what CTranslate2 does not keep: dropout, label smoothing), and the residual stream's order."""
    path = folder / "model.bin"
    embedding = need(model, "decoder/embeddings/weight", path)
    d_model = embedding.size(1)
    layers = [count_layers(model, side) for side in ("encoder", "decoder")]
    ffn = need(model, "encoder/layer_0/ffn/linear_0/weight", path) if layers[0] else None
    stored_heads = [scalar(model, f"{side}/num_heads", heads or 0) for side in ("encoder", "decoder")]
    norms = [scalar(model, f"{side}/pre_norm", 1) for side in ("encoder", "decoder")]
    activations = [int(scalar(model, f"{side}/activation", 0)) for side in ("encoder", "decoder")]
    scales = [scalar(model, f"{side}/scale_embeddings", 1) for side in ("encoder", "decoder")]
    for what, values in (("num_heads", stored_heads), ("pre_norm", norms), ("activation", activations),
                         ("scale_embeddings", scales)):
        if values[0] != values[1]:
            raise NmtError(f"{path}: the encoder's {what} {values[0]:g} and the decoder's {values[1]:g}: nmt-cli's "
                           "share it")
    if activations[0] not in ACTIVATIONS:
        raise NmtError(f"{path}: activation {activations[0]} (nmt-cli has relu, gelu and its approximations, swish)")
    if not stored_heads[0]:
        raise NmtError(f"{path}: no num_heads in the model")
    positions, order, rows = position_kind(model, d_model, path)
    mine = about.get("model_config") if isinstance(about.get("model_config"), dict) else {}
    kept = {key: mine[key] for key in ("dropout", "attention_dropout", "relu_dropout", "label_smoothing")
            if key in mine}
    try:
        config = ModelConfig(
            encoder_layers=layers[0], decoder_layers=layers[1], d_model=d_model,
            d_ff=ffn.size(0) if ffn is not None else 4 * d_model, heads=int(stored_heads[0]), positions=positions,
            norm="pre" if norms[0] else "post", max_positions=rows, activation=ACTIVATIONS[activations[0]],
            scale_embeddings=bool(scales[0]), tied_output=model.same("decoder/projection/weight",
                                                                      "decoder/embeddings/weight"),
            output_bias=model.get("decoder/projection/bias") is not None,
            embedding_norm=model.get("decoder/layernorm_embedding/gamma") is not None,
            norm_eps=float(settings.get("layer_norm_epsilon") or LAYER_NORM_EPSILON),
            source_eos=bool(settings.get("add_source_eos")) or other_start, **kept)
    except (ValueError, TypeError) as e:
        raise NmtError(f"{path}: {e}") from None
    return config, order


def need(model: ModelBin, name: str, path: Path) -> Tensor:
    tensor = model.get(name)
    if tensor is None:
        raise NmtError(f"{path}: no {name}: not a Transformer nmt-cli can hold")
    return tensor


def count_layers(model: ModelBin, side: str) -> int:
    n = 0
    while model.get(f"{side}/layer_{n}/ffn/linear_0/weight") is not None:
        n += 1
    return n


def position_kind(model: ModelBin, d_model: int, path: Path) -> tuple[str, Tensor | None, int]:
    """sinusoidal (interleaved as ours, or sines first: the order to undo) or learned, and the
    positions both tables hold."""
    tables = [need(model, f"{side}/position_encodings/encodings", path) for side in ("encoder", "decoder")]
    rows = min(t.size(0) for t in tables)
    ours = positional_encoding(rows, d_model)
    for order in (None, sines_then_cosines(d_model)):
        expected = ours if order is None else ours[:, order]
        if all(t.shape[1] == d_model and (t[:rows] - expected).abs().max() <= POSITION_TOLERANCE for t in tables):
            return "sinusoidal", order, rows
    return "learned", None, rows


def source_embedding(model: ModelBin) -> str:
    """The source embedding's name (`embeddings` in older versions, `embeddings_0` since)."""
    return "encoder/embeddings_0/weight" if model.get("encoder/embeddings_0/weight") is not None else \
        "encoder/embeddings/weight"


def ct2_weights(model: ModelBin, config: ModelConfig) -> dict[str, Tensor]:
    """The spec's variables under our names; every variable of the network must find its place."""
    used: set[str] = set()

    def take(name: str, rows: int | None = None) -> Tensor:
        tensor = model.get(name)
        if tensor is None:
            if rows is None:
                raise NmtError(f"model.bin: no {name}: not a Transformer nmt-cli can hold")
            return torch.zeros(rows)  # a bias CTranslate2 did not store
        used.add(name)
        return tensor.float().clone()

    weights: dict[str, Tensor] = {}

    def linear(ours: str, theirs: str) -> None:
        weights[f"{ours}.weight"] = take(f"{theirs}/weight")
        weights[f"{ours}.bias"] = take(f"{theirs}/bias", weights[f"{ours}.weight"].size(0))

    def norm(ours: str, theirs: str) -> None:
        weights[f"{ours}.weight"], weights[f"{ours}.bias"] = take(f"{theirs}/gamma"), take(f"{theirs}/beta")

    weights["src_embed.tokens.weight"] = take(source_embedding(model))
    weights["tgt_embed.tokens.weight"] = take("decoder/embeddings/weight")
    weights["output_projection.weight"] = take("decoder/projection/weight")
    if config.output_bias:
        weights["output_projection.bias"] = take("decoder/projection/bias")
    for side, ours in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        if config.embedding_norm:
            norm(f"{ours}.norm", f"{side}/layernorm_embedding")
        table = take(f"{side}/position_encodings/encodings")
        if config.positions == "learned":
            weights[f"{ours}.learned.weight"] = table[:config.max_positions]
    for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            theirs, ours = f"{side}/layer_{i}/", f"{side}_layers.{i}."
            attentions = [("self_attn", "self_attention", ("qkv", "out"))]
            if side == "decoder":
                attentions.append(("cross_attn", "attention", ("q", "kv", "out")))
            for n, (mine, name, parts) in enumerate(attentions):
                for k, part in enumerate(parts):
                    linear(f"{ours}{mine}.{part}", f"{theirs}{name}/linear_{k}")
                norm(f"{ours}sublayers.{n}.norm", f"{theirs}{name}/layer_norm")
            linear(f"{ours}ffn.w1", f"{theirs}ffn/linear_0")
            linear(f"{ours}ffn.w2", f"{theirs}ffn/linear_1")
            norm(f"{ours}sublayers.{len(attentions)}.norm", f"{theirs}ffn/layer_norm")
        if config.norm == "pre":
            norm(f"{side}_norm", f"{side}/layer_norm")
    unplaced = sorted(name for name, tensor in {**model.variables, **{a: model.get(a) for a in model.aliases}}.items()
                      if name not in used and tensor is not None and tensor.dim() > 0)
    if unplaced:
        what = next((f" ({kind})" for part, kind in UNHELD.items() if part in unplaced[0]), "")
        raise NmtError(f"model.bin: variable {unplaced[0]}{what}, which nmt-cli's Transformer has no place for")
    return weights


def special_rows(tokens: list[str], names: dict[str, str], start: str, zero_start: bool, folder: Path) -> Side:
    """One side's special roles: padding is OpenNMT-py's <blank> or <pad> (a new zero row where there
    is neither: CTranslate2 never reads one), the start is `start` (a new zero row for a decoder
    that starts from zeros)."""
    pad = next((tokens.index(t) for t in ("<blank>", "<pad>") if t in tokens), None)
    rows = len(tokens)
    if pad is None:
        pad, rows = rows, rows + 1
    eos, unk = (token_id(tokens, names[role], folder) for role in ("eos", "unk"))
    if zero_start:
        first = rows
        rows += 1
    else:
        first = token_id(tokens, start, folder) if start in tokens else pad
    return Side(tokens + ["<pad>"] * (rows - len(tokens)), pad, first, eos, unk)


def grow_rows(weights: dict[str, Tensor], sides: tuple[Side, Side]) -> None:
    """Zero rows for the roles special_rows added (a padding, a zero start), in each matrix of tokens."""
    names = {"src_embed.tokens.weight": sides[0], "tgt_embed.tokens.weight": sides[1],
             "output_projection.weight": sides[1], "output_projection.bias": sides[1]}
    for name, side in names.items():
        if name in weights and weights[name].size(0) < len(side.tokens):
            tensor = weights[name]
            weights[name] = torch.cat([tensor, tensor.new_zeros(len(side.tokens) - tensor.size(0), *tensor.shape[1:])])


def text_pipeline(model: Path, folder: Path, options: ImportConfig, langs: tuple[str | None, str | None],
                  about: dict[str, Any]) -> tuple[TextConfig, tuple[bytes | None, bytes | None], str | None, str]:
    """The text settings, SentencePiece models (source, target), BPE codes and what was read: those
    given, else nmt-cli.json's beside the `model` (an export of ours), else in `folder` an Argos
    package's `sentencepiece.model` or `bpe.model`, or a release's `source.spm` and `target.spm`
    (Marian's, copied by the converter)."""
    given = options.sentencepiece or options.bpe_codes or options.tokenizer
    if isinstance(about.get("text_config"), dict) and not given:
        files = {n: model / n for n in ("spm.model", "spm.target.model", "bpe.codes") if (model / n).is_file()}
        pieces = [sentencepiece_file(files[n]) if n in files else None for n in ("spm.model", "spm.target.model")]
        codes = read_codes(files["bpe.codes"]) if "bpe.codes" in files else None
        read = " and ".join(map(str, [model / "nmt-cli.json", *files.values()]))
        return TextConfig.from_dict(about["text_config"]), (pieces[0], pieces[1] or pieces[0]), codes, read
    source, target = langs
    if source is None or target is None:
        raise NmtError(f"{folder}: the model names no languages: give -s SRC -t TGT")
    if given:
        text = peer_text((source, target), options.tokenizer, options.sentencepiece is not None, "CTranslate2")
        piece = sentencepiece_file(options.sentencepiece) if options.sentencepiece else None
        codes = read_codes(options.bpe_codes) if options.bpe_codes else None
        return text, (piece, piece), codes, "as given"
    if (folder / "sentencepiece.model").is_file():
        piece = sentencepiece_file(folder / "sentencepiece.model")
        text = TextConfig(source_lang=source, target_lang=target, subword="sentencepiece")
        return text, (piece, piece), None, str(folder / "sentencepiece.model")
    if (folder / "bpe.model").is_file():  # Argos' BPETokenizer
        text = TextConfig(source_lang=source, target_lang=target, subword="bpe", **ARGOS_MOSES)
        return text, (None, None), read_codes(folder / "bpe.model"), f"Moses, then {folder / 'bpe.model'}"
    if (folder / "source.spm").is_file() and (folder / "target.spm").is_file():
        pieces = (sentencepiece_file(folder / "source.spm"), sentencepiece_file(folder / "target.spm"))
        return marian_text((source, target)), pieces, None, f"{folder / 'source.spm'} and {folder / 'target.spm'}"
    raise NmtError(f"{folder}: no text pipeline beside the model (sentencepiece.model, bpe.model, source.spm): give "
                   "--sentencepiece, --bpe-codes, or --tokenizer none for word tokens")
