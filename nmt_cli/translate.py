"""`nmt translate`: raw text in, raw text out, one output line per input line, in input order.

Input is read in chunks (memory does not grow with the file); within a chunk sentences are sorted
by length and batched by tokens, translated with `search.beam_search`, and written back in input
order. An empty line gives an empty line. A line longer than the model's positions is truncated
with a warning naming the line.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from nmt_cli import NmtError, kernels
from nmt_cli.checkpoint import ModelBundle, load_bundle
from nmt_cli.config import SearchConfig, TranslateConfig
from nmt_cli.data import pad
from nmt_cli.device import select as select_device
from nmt_cli.files import remove_stale_temporaries, replacing
from nmt_cli.lines import chunks, decode_lines
from nmt_cli.model import Transformer
from nmt_cli.search import Ensemble, Hypothesis, beam_search, sample
from nmt_cli.text import TextProcessor
from nmt_cli.vocab import BOS_ID, EOS_ID

CHUNK_LINES = 4096


class Translator:
    """A model (or ensemble) with its text pipeline, translating lists of lines."""

    def __init__(self, bundles: list[ModelBundle], config: TranslateConfig, device: torch.device,
                 dtype: torch.dtype = torch.float32, warn: Callable[[str], None] | None = None) -> None:
        first = bundles[0]
        for other in bundles[1:]:
            if other.tgt_vocab != first.tgt_vocab or other.src_vocab != first.src_vocab:
                raise NmtError("ensemble members must share their vocabularies")
        self.config, self.device, self.dtype = config, device, dtype
        self.bundle = first
        models = [b.model.to(device=device, dtype=dtype) for b in bundles]
        if config.quantize == "int8":
            for model in models:
                quantize_int8(model, device, dtype)
        if config.cuda_graphs and device.type != "cuda":
            raise NmtError(f"--cuda-graphs needs a CUDA device, not {device.type}")
        self.models = Ensemble(models, graphs=config.cuda_graphs and not config.search.sampling)
        codes = first.bpe_codes if config.input_format == "raw" else None
        self.source = TextProcessor(first.text, first.text.source_lang, codes, first.sentencepiece)
        target_codes = codes if config.prefix else None  # BPE on the target side only for --prefix
        self.target = TextProcessor(first.text, first.text.target_lang, target_codes, first.sentencepiece)
        self.generator = torch.Generator(device)
        if config.search.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(config.search.seed)
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        self.halved = False  # a batch was split after running out of GPU memory (warned once)

    def encode(self, line: str, number: int, side: str = "source") -> list[int]:
        """Source (or, for --prefix, target) token ids of a line, cut to the model's positions."""
        processor, vocab = (self.source, self.bundle.src_vocab) if side == "source" else \
            (self.target, self.bundle.tgt_vocab)
        ids = vocab.encode(processor.encode(line) if self.config.input_format == "raw" else line.split())
        limit = self.models.max_positions - (1 if side == "source" else 2)  # room for EOS (and a token)
        if len(ids) > limit:
            what = "tokens" if side == "source" else "prefix tokens"
            self.warn(f"warning: line {number}: {len(ids)} {what}, more than the model's {limit}; "
                      f"{'translating' if side == 'source' else 'keeping'} the first {limit}")
            ids = ids[:limit]
        return ids

    def detokenize(self, ids: list[int]) -> str:
        tokens = self.bundle.tgt_vocab.decode(ids)
        if self.config.output_format == "text":
            return self.target.decode(tokens)
        if self.config.output_format == "tokens":
            return " ".join(tokens).replace("@@ ", "").removesuffix("@@")
        return " ".join(tokens)

    def translate_ids(self, sources: list[list[int]], prefixes: list[list[int]] | None = None,
                      search: SearchConfig | None = None) -> list[list[Hypothesis]]:
        """Beam search (or sampling) over non-empty sources, batched by length, each output
        starting with its prefix when given; results in input order. `search` replaces the
        configured search options (`nmt serve`'s per-request options)."""
        search = search or self.config.search
        results: list[list[Hypothesis]] = [[] for _ in sources]
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        for batch in batches(order, sources, self.config):
            for i, h in zip(batch, self.search_fitting(batch, sources, prefixes, search)):
                results[i] = h
        return results

    def search_fitting(self, batch: list[int], sources: list[list[int]], prefixes: list[list[int]] | None,
                       search: SearchConfig) -> list[list[Hypothesis]]:
        """The hypotheses of `batch`; where the GPU runs out of memory, those of its two halves."""
        try:
            return self.search_batch(batch, sources, prefixes, search)
        except torch.cuda.OutOfMemoryError:
            if len(batch) == 1:
                raise NmtError(f"CUDA out of memory translating a single sentence of {len(sources[batch[0]])} "
                               "tokens; use a smaller --beam or --device cpu") from None
        self.models.release_graphs()  # their padded caches are the largest buffers kept
        torch.cuda.empty_cache()
        if not self.halved:
            self.warn(f"warning: CUDA out of memory for {len(batch)} sentences at once: translating such batches "
                      "in halves (a smaller --max-tokens avoids the retries)")
            self.halved = True
        half = len(batch) // 2
        return [hyps for part in (batch[:half], batch[half:])
                for hyps in self.search_fitting(part, sources, prefixes, search)]

    def search_batch(self, batch: list[int], sources: list[list[int]], prefixes: list[list[int]] | None,
                     search: SearchConfig) -> list[list[Hypothesis]]:
        src = pad([np.array(sources[i] + [EOS_ID]) for i in batch]).to(self.device)
        forced = None
        if prefixes is not None and any(prefixes[i] for i in batch):
            forced = pad([np.array(prefixes[i], dtype=np.int64) for i in batch], value=-1).to(self.device)
        if search.sampling:
            return sample(self.models, src, search, self.generator, forced)
        return beam_search(self.models, src, search, forced)

    def search_lines(self, lines: list[str], first_number: int = 1,
                     search: SearchConfig | None = None) -> tuple[list[list[int]], list[list[Hypothesis]]]:
        """The source ids of `lines` (and of their prefixes, with --prefix) and their hypotheses;
        lines are numbered from `first_number` in warnings."""
        pairs = [line.partition("\t")[::2] if self.config.prefix else (line, "") for line in lines]
        sources = [self.encode(src, first_number + k) if src.strip() else [] for k, (src, _) in enumerate(pairs)]
        prefixes = [self.encode(prefix, first_number + k, "target") if prefix.strip() else []
                    for k, (_, prefix) in enumerate(pairs)] if self.config.prefix else None
        return sources, self.translate_ids(sources, prefixes, search)

    def translate_records(self, lines: list[str], search: SearchConfig) -> list[dict[str, Any]]:
        """The `--format jsonl` record of each line, searched with `search` (`nmt serve`)."""
        sources, hypotheses = self.search_lines(lines, search=search)
        return [self.record(k + 1, sources[k], hyps, None) for k, hyps in enumerate(hypotheses)]

    def translate_lines(self, lines: list[str], first_number: int = 1) -> list[str]:
        """Output lines (text or JSON) for `lines`, numbered from `first_number` in warnings."""
        sources, hypotheses = self.search_lines(lines, first_number)
        outputs = []
        for k, hyps in enumerate(hypotheses):
            number = first_number + k
            weights = self.attention(sources[k], hyps[0].tokens) if hyps and self.wants_attention else None
            if weights is not None and self.config.attention_plot is not None:
                from nmt_cli.plot import attention_maps

                attention_maps(weights, *self.labels(sources[k], hyps[0].tokens), self.config.attention_plot,
                               f"line{number:06d}", self.config.plot_layers, self.config.plot_heads)
            if self.config.format == "jsonl":
                outputs.append(json.dumps(self.record(number, sources[k], hyps, weights), ensure_ascii=False))
            else:
                outputs.append(self.detokenize(hyps[0].tokens) if hyps else "")
        return outputs

    @property
    def wants_attention(self) -> bool:
        return self.config.attention_plot is not None or (self.config.format == "jsonl" and self.config.attention)

    def attention(self, source: list[int], output: list[int]) -> dict[str, list[torch.Tensor]]:
        """Every attention distribution of the first model on (source, its translation)."""
        model = self.models.models[0]
        src = torch.tensor([source + [EOS_ID]], device=self.device)
        tgt_in = torch.tensor([[BOS_ID] + output], device=self.device)
        return model.attention_weights(src, tgt_in)

    def labels(self, source: list[int], output: list[int]) -> tuple[list[str], list[str]]:
        """Axis labels: source and output subwords, each ending in </s>."""
        return self.bundle.src_vocab.decode(source + [EOS_ID]), self.bundle.tgt_vocab.decode(output + [EOS_ID])

    def record(self, number: int, source: list[int], hyps: list[Hypothesis],
               weights: dict[str, list[torch.Tensor]] | None) -> dict[str, Any]:
        nbest = [{"text": self.detokenize(h.tokens), "tokens": self.bundle.tgt_vocab.decode(h.tokens),
                  "score": round(h.score, 6), "log_prob": round(h.log_prob, 6)} for h in hyps]
        record = {"line": number, "translation": nbest[0]["text"] if nbest else "", "nbest": nbest}
        if weights is not None and self.config.attention:
            layers = weights["cross"]
            layer = self.config.attention_layer or len(layers)
            if not 1 <= layer <= len(layers):
                raise NmtError(f"--attention-layer {layer}: the model has {len(layers)} decoder layers")
            src_tokens, tgt_tokens = self.labels(source, hyps[0].tokens)
            matrix = layers[layer - 1][0].mean(0).float().cpu()  # (output tokens, source tokens), heads averaged
            record["attention"] = {"layer": layer, "src_tokens": src_tokens, "tgt_tokens": tgt_tokens,
                                   "weights": [[round(w, 5) for w in row] for row in matrix.tolist()]}
        return record


def batches(order: list[int], sources: list[list[int]], config: TranslateConfig) -> Iterator[list[int]]:
    """Consecutive runs of the length-sorted `order` within --max-tokens and --batch-size."""
    batch: list[int] = []
    for i in order:
        width = len(sources[i]) + 1
        too_many = config.batch_size is not None and len(batch) >= config.batch_size
        if batch and (too_many or (len(batch) + 1) * width > config.max_tokens):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def quantize_int8(model: Transformer, device: torch.device, dtype: torch.dtype) -> None:
    """`--quantize int8`: see kernels.quantize_int8; CPU and float32 only."""
    if device.type != "cpu" or dtype != torch.float32:
        raise NmtError(f"--quantize int8 runs on the CPU in fp32 (add --device cpu), not on {device.type} "
                       f"in {str(dtype).removeprefix('torch.')}")
    try:
        with warnings.catch_warnings():  # torch >= 2.10 warns that torch.ao moves to torchao
            warnings.simplefilter("ignore")
            kernels.quantize_int8(model)
    except (ImportError, RuntimeError) as e:
        raise NmtError(f"--quantize int8: this PyTorch cannot quantize on this CPU ({e})") from None


def translate_stream(translator: Translator, source: IO[bytes], source_name: str, write: Callable[[str], None],
                     progress: bool = False) -> int:
    """Translate every line of `source` and `write` each output line; returns the line count.
    Typed at a terminal, each line is translated as soon as it is entered."""
    from tqdm import tqdm

    count = 0
    size = 1 if source.isatty() else CHUNK_LINES
    with tqdm(unit="line", disable=not (progress and sys.stderr.isatty()), file=sys.stderr) as bar:
        for chunk in chunks(decode_lines(source, source_name), size):
            for line in translator.translate_lines(chunk, count + 1):
                write(line + "\n")
            count += len(chunk)
            bar.update(len(chunk))
    return count


def translate_file(checkpoints: list[Path], input_path: Path | None, output_path: Path | None,
                   config: TranslateConfig) -> int:
    """The `nmt translate` command: files or stdin/stdout; the output file appears only when complete."""
    if output_path is not None and not output_path.parent.is_dir():
        raise NmtError(f"{output_path}: cannot write the translation (no such directory: {output_path.parent})")
    torch_device, dtype = select_device(config.device, config.precision, config.threads)
    translator = Translator([load_bundle(path) for path in checkpoints], config, torch_device, dtype)
    source = open(input_path, "rb") if input_path else sys.stdin.buffer
    name = str(input_path) if input_path else "<stdin>"
    try:
        if output_path is None:
            return translate_stream(translator, source, name, sys.stdout.write)
        remove_stale_temporaries(output_path.parent)
        with replacing(output_path, "the translation") as tmp, open(tmp, "w", encoding="utf-8") as out:
            return translate_stream(translator, source, name, out.write, progress=input_path is not None)
    finally:
        if input_path:
            source.close()
