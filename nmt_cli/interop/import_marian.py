"""Released models in Marian's own format: model.npz (its model.yml inside), decoder.yml, the
vocabularies (.yml, or .spm) and the SentencePiece models, read into a `Release` as CTranslate2's
Marian converter reads them: post-norm or pre-norm, relu, swish or Marian's sigmoid GELU, tied or
untied output, the decoder started from a zero vector; what else Marian can be is refused."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.errors import NmtError
from nmt_cli.files import note_read, small_file
from nmt_cli.interop.reading import sentencepiece_file, setting, token_id, tokens_by_id
from nmt_cli.interop.release import Release, Side, marian_text, sines_then_cosines
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.run_config import ImportConfig
from nmt_cli.text.pieces import load_sentencepiece


def read_marian(source: Path, options: ImportConfig, warn: Callable[[str], None]) -> Release:
    """A Marian release: model.npz (its model.yml inside), decoder.yml, vocabularies, .spm files."""
    decoder = read_yaml(source / "decoder.yml") if (source / "decoder.yml").is_file() else {}
    names = decoder.get("models") or [p.name for p in sorted(source.glob("*.npz"))][:1]
    path = source / Path(str(names[0])).name
    with Npz(path) as npz:
        config = parse_yaml(npz.model_yml(), f"{path}: special:model.yml")
        model_config = marian_config(config, path).replace(tied_output=not any(
            f"decoder_ff_logit_out_{w}" in npz for w in ("W", "Wt")))
        vocab_paths = [source / Path(str(v)).name for v in decoder.get("vocabs") or []] or \
            sorted(source.glob("*vocab*.yml"))[:1] * 2
        if len(vocab_paths) != 2:
            raise NmtError(f"{source}: decoder.yml names {len(vocab_paths)} vocabularies; nmt import reads a source "
                           "and a target one")
        read = {p: marian_vocabulary(p) for p in dict.fromkeys(vocab_paths)}  # a joint one once
        tokens = [read[p] for p in vocab_paths]
        shared = "Wemb" in npz
        npz.check_layers(model_config)
        ours = marian_weights(npz, model_config, shared, (len(tokens[0]), len(tokens[1])))
    # Marian has no <pad> and starts the decoder from a zero vector: both take a zero row appended
    # to each vocabulary (its id: the vocabulary's size).
    sides = [Side(t + ["<pad>"], len(t), len(t), token_id(t, "</s>", p), token_id(t, "<unk>", p))
             for t, p in zip(tokens, vocab_paths)]
    for name, tensor in ours.items():
        if name.endswith("tokens.weight") or name.startswith("output_projection"):
            ours[name] = torch.cat([tensor, tensor.new_zeros(1, *tensor.shape[1:])])
    spm = [source / name for name in ("source.spm", "target.spm")]
    where = source / "decoder.yml"
    search = {"beam": setting(decoder, "beam-size", int, 12, where, low=1),
              "lenpen": float(setting(decoder, "normalize", float, 0.0, where)), "lenpen_form": "length",
              "stopping": "early", "max_len_a": float(setting(decoder, "max-length-factor", float, 3.0, where, low=0)),
              "max_len_b": 0, "allow_unk": setting(decoder, "allow-unk", bool, False, where)}
    if decoder.get("word-penalty"):
        warn(f"warning: {source / 'decoder.yml'}: word-penalty not carried over (nmt-cli's search has none)")
    source_spm, target_spm = map(sentencepiece_file, spm)
    langs = (str(decoder.get("source-language") or "src"), str(decoder.get("target-language") or "tgt"))
    return Release(model_config, ours, sides[0], sides[1], shared, marian_text(langs), source_spm, target_spm, None,
                   search, [], f"Marian ({path.name})", sines_then_cosines(model_config.d_model))


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        return parse_yaml(small_file(path, "a Marian settings file", YAML_BYTES).decode("utf-8"), str(path))
    except UnicodeDecodeError:
        raise NmtError(f"{path}: not UTF-8 text") from None


def parse_yaml(text: str, where: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise NmtError(f"{where}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise NmtError(f"{where}: not a YAML mapping")
    return data


class Npz:
    """The arrays of a model.npz, each read when asked for and only once its header shows the shape
    the model needs: an entry never used is never read, and none larger than the model.yml and the
    vocabularies say is allocated (a damaged or hostile file costs no memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        note_read(path)
        try:
            self.zip = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as e:
            raise NmtError(f"{path}: not a readable Marian model ({e})") from None
        self.members = {name.removesuffix(".npy"): name for name in self.zip.namelist()}

    def __contains__(self, name: str) -> bool:
        return name in self.members

    def __enter__(self) -> Npz:
        return self

    def __exit__(self, *_: object) -> None:
        self.zip.close()

    def header(self, name: str) -> tuple[tuple[int, ...], Any]:
        """The shape and dtype of entry `name`, from its header alone."""
        import numpy as np

        try:
            with self._open(name) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise NmtError(f"{self.path}: {name}: unreadable ({str(e).splitlines()[0][:200]})") from None
        return shape, dtype

    def array(self, name: str) -> Any:
        import numpy as np

        try:
            with self._open(name) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise NmtError(f"{self.path}: {name}: unreadable ({str(e).splitlines()[0][:200]})") from None

    def tensor(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """Entry `name` as a float tensor of `shape` (a bias or norm (1, n) may be stored as (n,))."""
        if name not in self:
            raise NmtError(f"{self.path}: no tensor {name}")
        found, dtype = self.header(name)
        if found != shape and not (shape[0] == 1 and found == shape[1:]):
            raise NmtError(f"{self.path}: tensor {name} has shape {list(found)}, its model.yml and vocabularies "
                           f"give {list(shape)}")
        if dtype.kind != "f":
            raise NmtError(f"{self.path}: tensor {name} holds {dtype} values, not floating point")
        return torch.from_numpy(self.array(name).astype("float32", copy=False)).reshape(shape)

    def model_yml(self) -> str:
        """The model.yml inside (a string of bytes, at most YAML_BYTES)."""
        if "special:model.yml" not in self:
            raise NmtError(f"{self.path}: no special:model.yml inside (not a Marian model)")
        shape, dtype = self.header("special:model.yml")
        if len(shape) != 1 or dtype.itemsize != 1 or shape[0] > YAML_BYTES:
            raise NmtError(f"{self.path}: special:model.yml is not a string of at most {YAML_BYTES:,} bytes")
        return bytes(self.array("special:model.yml")).rstrip(b"\0").decode("utf-8", errors="replace")

    def check_layers(self, config: ModelConfig) -> None:
        """The layers the weights hold are the model.yml's, no fewer and no more."""
        for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
            held = {int(m.group(1)) for name in self.members if (m := re.match(fr"{side}_l(\d+)_", name))}
            if held != set(range(1, count + 1)):
                raise NmtError(f"{self.path}: the weights hold {side} layers {sorted(held)}, its model.yml "
                               f"{count} ({side[:3]}-depth)")

    def _open(self, name: str) -> Any:
        return self.zip.open(self.members[name])


def marian_vocabulary(path: Path) -> list[str]:
    """Tokens by id of a Marian vocabulary: a .yml of `token: id` lines, or a SentencePiece model."""
    if path.suffix == ".spm":
        processor = load_sentencepiece(sentencepiece_file(path), str(path), specials=False)
        return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    import yaml

    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # libyaml's where there is one: 10x faster
    text = small_file(path, "a Marian vocabulary", VOCABULARY_BYTES).decode("utf-8", errors="replace")
    try:  # the base loader keeps every key a string ("yes", "1", "null" are tokens, not values)
        mapping = yaml.load(text, Loader=loader)
    except (yaml.YAMLError, RecursionError) as e:
        raise NmtError(f"{path}: not a Marian vocabulary ({str(e).splitlines()[0][:200]})") from None
    if not isinstance(mapping, dict) or not all(str(i).isdigit() for i in mapping.values()):
        raise NmtError(f"{path}: not a Marian vocabulary (token: id lines)")
    return tokens_by_id({t: int(i) for t, i in mapping.items()}, path)


YAML_BYTES = 1 << 20  # decoder.yml, model.yml: settings, not data
VOCABULARY_BYTES = 64 << 20  # a vocabulary .yml: a few MB for the largest releases

MARIAN_ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu-sigmoid"}


def marian_config(config: dict[str, Any], path: Path) -> ModelConfig:
    """Our ModelConfig of a Marian model.yml, or a one-line refusal naming the option."""
    where = f"{path}: special:model.yml"
    pre = config.get("transformer-preprocess", "") == "n"
    wanted = {"type": "transformer", "transformer-decoder-autoreg": "self-attention",
              "transformer-postprocess": "da" if pre else "dan", "transformer-postprocess-top": "n" if pre else "",
              "transformer-preprocess": "n" if pre else "", "transformer-no-projection": False,
              "transformer-ffn-depth": 2, "transformer-tied-layers": [], "factors-dim-emb": 0}
    for key, value in wanted.items():
        if config.get(key, value) not in (value, None) and config.get(key) != "":
            raise NmtError(f"{where}: {key} {config.get(key)!r} (nmt-cli holds {value!r})")
    if config.get("transformer-postprocess-emb", "d") not in ("", "d"):
        raise NmtError(f"{where}: transformer-postprocess-emb {config['transformer-postprocess-emb']!r}: a layer "
                       "norm on the embeddings, which nmt-cli's model does not have")
    if config.get("transformer-train-position-embeddings"):
        raise NmtError(f"{where}: learned positions (transformer-train-position-embeddings); nmt-cli's imported "
                       "models have sinusoidal ones")
    decoder_ffn = config.get("transformer-decoder-dim-ffn") or config.get("transformer-dim-ffn")
    if decoder_ffn != config.get("transformer-dim-ffn") or \
            (config.get("transformer-decoder-ffn-depth") or 2) != 2:
        raise NmtError(f"{where}: a decoder FFN of another shape than the encoder's (nmt-cli's share one)")
    activation = config.get("transformer-ffn-activation", "swish")
    if activation not in MARIAN_ACTIVATIONS:
        raise NmtError(f"{where}: transformer-ffn-activation {activation!r} (nmt-cli has "
                       f"{', '.join(MARIAN_ACTIVATIONS)})")
    try:
        return ModelConfig(
            encoder_layers=config["enc-depth"], decoder_layers=config["dec-depth"], d_model=config["dim-emb"],
            d_ff=config["transformer-dim-ffn"], heads=config["transformer-heads"],
            dropout=float(config.get("transformer-dropout", 0.1)),
            attention_dropout=float(config.get("transformer-dropout-attention", 0.0)),
            relu_dropout=float(config.get("transformer-dropout-ffn", 0.0)),
            max_positions=max(int(config.get("max-length", 256)) + 1, 1024),
            activation=MARIAN_ACTIVATIONS[activation], norm="pre" if pre else "post", output_bias=True)
    except KeyError as e:
        raise NmtError(f"{where}: no {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:
        raise NmtError(f"{where}: {e}") from None


def marian_shape(name: str, config: ModelConfig, rows: tuple[int, int]) -> tuple[int, ...]:
    """The shape of Marian's tensor `name` in a model of `config` with `rows` source and target
    tokens: matrices (in, out), biases and norms (1, n)."""
    d, ff = config.d_model, config.d_ff
    if name in ("Wemb", "encoder_Wemb", "decoder_Wemb", "decoder_ff_logit_out_Wt"):
        return rows[0] if name == "encoder_Wemb" else rows[1], d
    if name.startswith("decoder_ff_logit_out_"):
        return (d, rows[1]) if name.endswith("_W") else (1, rows[1])
    last = name.rsplit("_", 1)[1]
    return {"W1": (d, ff), "b1": (1, ff), "W2": (ff, d)}.get(last, (d, d) if re.fullmatch("W[qkvo]", last) else (1, d))


def marian_weights(npz: Npz, config: ModelConfig, shared: bool, rows: tuple[int, int]) -> dict[str, Tensor]:
    """Marian's weights under our names, matrices as torch lays them out (Marian's are (in, out))."""
    if "Wpos" in npz:
        raise NmtError(f"{npz.path}: learned positions (Wpos); nmt-cli's imported models have sinusoidal ones")

    def take(name: str, transpose: bool = False) -> Tensor:
        tensor = npz.tensor(name, marian_shape(name, config, rows))
        return tensor.t() if transpose else tensor.reshape(-1) if tensor.size(0) == 1 else tensor

    def norm(prefix: str) -> tuple[Tensor, Tensor]:
        suffix = "_pre" if config.norm == "pre" else ""
        return take(f"{prefix}_ln_scale{suffix}"), take(f"{prefix}_ln_bias{suffix}")

    weights: dict[str, Tensor] = {}
    decoder_embedding = take("Wemb") if shared else take("decoder_Wemb")
    weights["tgt_embed.tokens.weight"] = decoder_embedding
    if not shared:
        weights["src_embed.tokens.weight"] = take("encoder_Wemb")
    if not config.tied_output:
        weights["output_projection.weight"] = take("decoder_ff_logit_out_W", transpose=True) \
            if "decoder_ff_logit_out_W" in npz else take("decoder_ff_logit_out_Wt")
    weights["output_projection.bias"] = take("decoder_ff_logit_out_b") if "decoder_ff_logit_out_b" in npz else \
        torch.zeros(decoder_embedding.size(0))
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            ours, theirs = f"{side}_layers.{i}.", f"{side}_l{i + 1}_"
            attentions = [("self_attn", "self")] + ([("cross_attn", "context")] if side == "decoder" else [])
            for k, (mine, name) in enumerate(attentions):
                scope = theirs + name
                fused = ("q", "k", "v") if mine == "self_attn" else ("k", "v")
                weights[f"{ours}{mine}.{'qkv' if mine == 'self_attn' else 'kv'}.weight"] = torch.cat(
                    [take(f"{scope}_W{p}", transpose=True) for p in fused])
                weights[f"{ours}{mine}.{'qkv' if mine == 'self_attn' else 'kv'}.bias"] = torch.cat(
                    [take(f"{scope}_b{p}") for p in fused])
                if mine == "cross_attn":
                    weights[f"{ours}{mine}.q.weight"] = take(f"{scope}_Wq", transpose=True)
                    weights[f"{ours}{mine}.q.bias"] = take(f"{scope}_bq")
                weights[f"{ours}{mine}.out.weight"] = take(f"{scope}_Wo", transpose=True)
                weights[f"{ours}{mine}.out.bias"] = take(f"{scope}_bo")
                weights[f"{ours}sublayers.{k}.norm.weight"], weights[f"{ours}sublayers.{k}.norm.bias"] = \
                    norm(f"{scope}_Wo")
            scope, last = theirs + "ffn", len(attentions)
            weights[f"{ours}ffn.w1.weight"], weights[f"{ours}ffn.w1.bias"] = take(f"{scope}_W1", True), \
                take(f"{scope}_b1")
            weights[f"{ours}ffn.w2.weight"], weights[f"{ours}ffn.w2.bias"] = take(f"{scope}_W2", True), \
                take(f"{scope}_b2")
            weights[f"{ours}sublayers.{last}.norm.weight"], weights[f"{ours}sublayers.{last}.norm.bias"] = \
                norm(f"{scope}_ffn")
    if config.norm == "pre":
        for side in ("encoder", "decoder"):
            weights[f"{side}_norm.weight"], weights[f"{side}_norm.bias"] = take(f"{side}_top_ln_scale"), \
                take(f"{side}_top_ln_bias")
    return weights
