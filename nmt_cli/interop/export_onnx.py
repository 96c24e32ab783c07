"""`nmt export --format onnx`: the model as ONNX graphs, for onnxruntime in any language (C#,
Java, C++, Python) with the search written there: the encoder, and the decoder's step with the
self-attention keys and values of earlier positions as inputs and outputs, so that a search
never recomputes them. The layout and names are Optimum's (which transformers.js reads):

- `onnx/encoder_model.onnx`: `input_ids`, `attention_mask` (batch, source) -> `last_hidden_state`;
- `onnx/decoder_model.onnx`, a target's first step(s): `input_ids` (batch, target),
  `encoder_attention_mask`, `encoder_hidden_states` -> `logits` and, per decoder layer i,
  `present.i.decoder.key` / `.value` (its self-attention's) and `present.i.encoder.key` / `.value`
  (its encoder-decoder attention's, computed once);
- `onnx/decoder_with_past_model.onnx`, each later step: `input_ids`, `encoder_attention_mask` and
  every `past_key_values.i.{decoder,encoder}.{key,value}` (the last step's presents) -> `logits`
  and the `present.i.decoder.*` grown by the step;
- `onnx/decoder_model_merged.onnx`: the two as one graph, chosen by `use_cache_branch`
  (`merge_decoders`).

Token ids are the checkpoint's vocabularies' (`shared_vocabulary.json`, or `source_vocabulary.json`
and `target_vocabulary.json`; `config.json` names the specials, and whether a source ends with
`</s>`: `add_source_eos`, false for OpenNMT-py's models); the text pipeline's files and
`nmt-cli.json` (writing.text_files) say how text becomes ids and back. Keys and values
are (batch, heads, positions, d_k); a search's beams are rows of their own (with their
sentence's encoder rows repeated).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from nmt_cli.errors import NmtError
from nmt_cli.interop.export_transformers import generation_config, marian_config
from nmt_cli.interop.tokenizer_json import javascript_refusal, tokenizer_config, tokenizer_json
from nmt_cli.interop.writing import text_files, write_export, write_json
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

if TYPE_CHECKING:
    from nmt_cli.interop.exporter import ExportRequest

OPSET = 18


class PastCache:
    """A decoder layer's self-attention keys and values as graph values (`KeyValueCache`): the
    `past` ones given, the present ones (past and new) kept; new positions see the past and,
    causally, each other."""

    def __init__(self, past: tuple[Tensor, Tensor] | None = None) -> None:
        self.past, self.present = past, None

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        past = 0 if self.past is None else self.past[0].size(2)
        if self.past is not None:
            k, v = torch.cat([self.past[0], k], dim=2), torch.cat([self.past[1], v], dim=2)
        self.present = (k, v)
        new = k.size(2) - past
        seen = torch.ones(new, k.size(2), dtype=torch.bool, device=k.device).tril(past)
        return k, v, seen


def encoder_mask(model: Transformer, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The model's own source mask (padding; a source's unseen end) and the caller's."""
    return model.source_mask(input_ids) & attention_mask.bool()[:, None, None, :]


class Encoder(nn.Module):
    """The encoder stack of input ids, attending where the caller's mask and the model's allow;
    an id past the vocabulary (a piece of tokenizer.json's that the vocabulary lacks) reads <unk>."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        input_ids = input_ids.masked_fill(input_ids >= self.model.src_embed.tokens.num_embeddings, UNK_ID)
        return self.model.encode(input_ids, encoder_mask(self.model, input_ids, attention_mask))[0]


class Decoder(nn.Module):
    """The decoder's step(s) from `past` (None: a target's first): logits and the presents."""

    def __init__(self, model: Transformer, with_past: bool) -> None:
        super().__init__()
        self.model, self.with_past = model, with_past

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        model, layers = self.model, len(self.model.decoder_layers)
        mask = encoder_attention_mask.bool()[:, None, None, :]
        if self.with_past:
            caches = [PastCache((rest[4 * i], rest[4 * i + 1])) for i in range(layers)]
            memory_kv = [(rest[4 * i + 2], rest[4 * i + 3]) for i in range(layers)]
            start = rest[0].size(2)
        else:
            caches = [PastCache() for _ in range(layers)]
            memory_kv = model.memory_keys_values(rest[0])
            start = 0
        positions = torch.arange(start, start + input_ids.size(1), device=input_ids.device)
        logits = model.output_projection(model.decode(input_ids, memory_kv, mask, caches, positions))
        # per layer its self-attention's keys and values, and at a first step its encoder's too
        pairs = [cache.present for cache in caches] if self.with_past else \
            [pair for cache, kv in zip(caches, memory_kv) for pair in (cache.present, kv)]
        return (logits, *(t for pair in pairs for t in pair))


def kv_names(prefix: str, layers: int, sides: tuple[str, ...] = ("decoder", "encoder")) -> list[str]:
    """The graph's names of each layer's keys and values (`present` or `past_key_values`)."""
    return [f"{prefix}.{i}.{side}.{part}" for i in range(layers) for side in sides for part in ("key", "value")]


def export_graphs(model: Transformer, out: Path) -> None:
    """The graphs of the module docstring, with dynamic batch and lengths."""
    model = model.float().eval()
    layers = len(model.decoder_layers)
    batch, source, target, past = (torch.export.Dim(name, min=1, max=4096) for name in
                                   ("batch", "source", "target", "past"))
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID]])
    src_mask = (src != PAD_ID).long()
    export_graph(Encoder(model), (src, src_mask), out / "encoder_model.onnx", ["input_ids", "attention_mask"],
                 ["last_hidden_state"], {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}})
    memory = Encoder(model)(src, src_mask).detach()
    tgt = torch.tensor([[BOS_ID, 5], [BOS_ID, 6]])
    first = kv_names("present", layers)
    export_graph(Decoder(model, with_past=False), (tgt, src_mask, memory), out / "decoder_model.onnx",
                 ["input_ids", "encoder_attention_mask", "encoder_hidden_states"], ["logits", *first],
                 {"input_ids": {0: batch, 1: target}, "encoder_attention_mask": {0: batch, 1: source},
                  "encoder_hidden_states": {0: batch, 1: source}})
    presents = Decoder(model, with_past=False)(tgt, src_mask, memory)[1:]
    shapes = {name: {0: batch, 2: past if ".decoder." in name else source} for name in kv_names("past_key_values",
                                                                                                layers)}
    export_graph(Decoder(model, with_past=True), (tgt[:, :1], src_mask, *(t.detach() for t in presents)),
                 out / "decoder_with_past_model.onnx",
                 ["input_ids", "encoder_attention_mask", *kv_names("past_key_values", layers)],
                 ["logits", *kv_names("present", layers, ("decoder",))],
                 {"input_ids": {0: batch, 1: torch.export.Dim.STATIC}, "encoder_attention_mask": {0: batch, 1: source},
                  **shapes})
    merge_decoders(out)


def merge_decoders(folder: Path, suffix: str = "") -> None:
    """`decoder_model_merged{suffix}.onnx`: both decoder graphs as the branches of one `If` on the input
    `use_cache_branch` (false: a target's first step, whose `past_key_values` are ignored and may
    be empty; true: a later one, whose `encoder_hidden_states` are ignored), as transformers.js
    loads a decoder; the past branch passes the encoder's keys and values through, so both give
    every present. A weight the branches share is stored once."""
    import onnx
    import onnx.compose
    from onnx import helper

    first, past = (onnx.load(str(folder / f"{name}{suffix}.onnx")) for name in ("decoder_model",
                                                                               "decoder_with_past_model"))
    outputs = {o.name: o for o in first.graph.output}
    branches, weights, stored = [], [], {}
    for model, prefix in ((first, "first."), (past, "past.")):
        graph = onnx.compose.add_prefix_graph(model.graph, prefix, rename_inputs=False, rename_outputs=False)
        renamed = {}
        for tensor in graph.initializer:
            key = (tuple(tensor.dims), tensor.data_type, tensor.raw_data)
            if key in stored and tensor.raw_data:
                renamed[tensor.name] = stored[key]
            else:
                stored[key] = tensor.name
                weights.append(tensor)
        for node in graph.node:
            node.input[:] = [renamed.get(name, name) for name in node.input]
        del graph.initializer[:], graph.input[:]  # the weights and inputs are the outer graph's
        branches.append(graph)
    for name in outputs:
        if ".encoder." in name:
            branches[1].node.append(helper.make_node("Identity", [name.replace("present", "past_key_values")],
                                                     [name]))
    for graph in branches:
        del graph.output[:]
        graph.output.extend(outputs.values())
    inputs = [*first.graph.input, *(i for i in past.graph.input if i.name.startswith("past_key_values")),
              helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])]
    node = helper.make_node("If", ["use_cache_branch"], list(outputs), then_branch=branches[1],
                            else_branch=branches[0])
    graph = helper.make_graph([node], "decoder_model_merged", inputs, list(outputs.values()), initializer=weights)
    merged = helper.make_model(graph, opset_imports=first.opset_import, ir_version=first.ir_version)
    onnx.checker.check_model(merged)
    onnx.save(merged, str(folder / f"decoder_model_merged{suffix}.onnx"))


def quantize_graphs(folder: Path) -> None:
    """int8 copies of the graphs, `*_quantized.onnx` (the names transformers.js loads for its dtype
    q8): onnxruntime's dynamic quantization, the weights of matrix products and embeddings in int8
    with a scale per output column, activations quantized as each product runs. The decoders are
    quantized before they are merged: quantization does not enter an `If`'s branches."""
    from onnxruntime.quantization import quantize_dynamic

    quiet = logging.getLogger()  # its advice to pre-process the graphs first, at warning level
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for name in ("encoder_model", "decoder_model", "decoder_with_past_model"):
            quantize_dynamic(folder / f"{name}.onnx", folder / f"{name}_quantized.onnx", per_channel=True)
    finally:
        quiet.setLevel(level)
    merge_decoders(folder, "_quantized")


def export_graph(module: nn.Module, args: tuple[Tensor, ...], path: Path, inputs: list[str], outputs: list[str],
                 shapes: dict[str, dict[int, Any]]) -> None:
    """One graph, its inputs and outputs named, its dimensions dynamic as `shapes` says (the
    modules take two inputs, then any number more)."""
    dims = [shapes.get(name) for name in inputs]
    quiet = logging.getLogger("torch.onnx._internal.exporter._registration")  # optional torchvision operators
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation notes, nothing of the model's
            program = torch.onnx.export(module, args, dynamo=True, input_names=inputs, output_names=outputs,
                                        dynamic_shapes=(*dims[:2], tuple(dims[2:])) if len(dims) > 2 else tuple(dims),
                                        opset_version=OPSET, report=False, verbose=False)
    finally:
        quiet.setLevel(level)
    program.save(str(path))


def export(request: ExportRequest) -> str | None:
    """`nmt export --format onnx`, with --quantize."""
    return save_onnx(load_bundle(request.model), request.output, request.config.quantization or "float32")


def save_onnx(bundle: ModelBundle, out: Path, quantization: str = "float32") -> str | None:
    """The ONNX export of `bundle` at `out` (a directory, written whole or not at all), with int8
    copies of the graphs where `quantization` is int8; returns a note of why it has no
    tokenizer.json for the JavaScript routes, if it has none."""
    refusal = javascript_refusal(bundle)
    write_export(out, lambda tmp: write_onnx(bundle, tmp, quantization, tokenizer=refusal is None))
    if refusal is None:
        return None
    return f"note: {out} is for onnxruntime with nmt's tokenizer (nmt-cli.json), not transformers.js: {refusal}"


def write_onnx(bundle: ModelBundle, folder: Path, quantization: str, tokenizer: bool) -> None:
    """The export's files into `folder`: the graphs (and their int8 copies), the model's and the
    search's settings, the vocabularies, the text pipeline's files and (`tokenizer`) tokenizer.json."""
    try:
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError:
        raise NmtError("--format onnx needs onnx and onnxscript: pip install 'nmt-cli[export]'") from None
    if quantization not in ("float32", "int8"):
        raise NmtError(f"--quantize float32 or int8 (onnxruntime's dynamic quantization), not {quantization}")
    (folder / "onnx").mkdir()
    export_graphs(bundle.model, folder / "onnx")
    if quantization == "int8":
        quantize_graphs(folder / "onnx")
    vocabularies(bundle, folder)
    write_json(folder / "config.json", model_config(bundle))
    write_json(folder / "generation_config.json",
               {**generation_config(dict, bundle), "decoder_start_token_id": BOS_ID})  # as model_config's
    if tokenizer:
        write_json(folder / "tokenizer.json", tokenizer_json(bundle))
        write_json(folder / "tokenizer_config.json", tokenizer_config(bundle))
    text_files(bundle, folder)


def model_config(bundle: ModelBundle) -> dict[str, Any]:
    """config.json: the network in MarianConfig's terms, as transformers.js and Optimum read them
    (the sizes of an empty past, the specials); a target starts with <s> (the graphs read the
    start row the model reads), and `add_source_eos` says whether a source ends with </s>."""
    return {**marian_config(dict, bundle), "model_type": "marian", "architectures": ["MarianMTModel"],
            "is_encoder_decoder": True, "decoder_start_token_id": BOS_ID, "unk_token_id": UNK_ID,
            "add_source_eos": bundle.model.config.source_eos}


def vocabularies(bundle: ModelBundle, out: Path) -> None:
    """The tokens of each side by id: one file when they are one."""
    sides = [("shared_vocabulary.json", bundle.tgt_vocab)] if bundle.shared else \
        [("source_vocabulary.json", bundle.src_vocab), ("target_vocabulary.json", bundle.tgt_vocab)]
    for name, vocab in sides:
        (out / name).write_text(json.dumps(vocab.tokens, ensure_ascii=False) + "\n", encoding="utf-8")
