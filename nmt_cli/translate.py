"""`nmt translate`: raw text in, raw text out, one output line per input line, in input order.

Input is read in chunks (memory does not grow with the file); within a chunk sentences are sorted
by length and batched by tokens, translated with `search.beam_search`, and written back in input
order. An empty line gives an empty line. A line longer than the model's positions is truncated
with a warning naming the line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from nmt_cli import NmtError
from nmt_cli.checkpoint import ModelBundle, load_bundle
from nmt_cli.config import SearchConfig, TranslateConfig
from nmt_cli.device import select as select_device
from nmt_cli.files import remove_stale_temporaries, replacing
from nmt_cli.generator import Generator
from nmt_cli.lines import arriving_chunks
from nmt_cli.search import Hypothesis
from nmt_cli.text import TextProcessor
from nmt_cli.vocab import BOS_ID, EOS_ID, UNK, UNK_ID

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
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        self.generator = Generator([b.model for b in bundles], device, dtype, max_tokens=config.max_tokens,
                                   batch_size=config.batch_size, never=first.tgt_vocab.fillers,
                                   graphs=config.cuda_graphs, quantize=config.quantize, seed=config.search.seed,
                                   warn=self.warn)
        self.models = self.generator.models
        codes = first.bpe_codes if config.input_format == "raw" else None
        self.source = TextProcessor(first.text, first.text.source_lang, codes, first.sentencepiece)
        target_codes = codes if config.prefix else None  # BPE on the target side only for --prefix
        self.target = TextProcessor(first.text, first.text.target_lang, target_codes, first.sentencepiece)
        self.unknown_prefix = False  # a prefix held tokens the vocabulary lacks (warned once)

    def encode(self, line: str, number: int, side: str = "source") -> list[int]:
        """Source (or, for --prefix, target) token ids of a line, cut to the model's positions."""
        processor, vocab = (self.source, self.bundle.src_vocab) if side == "source" else \
            (self.target, self.bundle.tgt_vocab)
        tokens = processor.encode(line) if self.config.input_format == "raw" else line.split()
        ids = vocab.encode(tokens)
        if side == "target" and not self.unknown_prefix and UNK_ID in ids:
            unknown = [t for t, i in zip(tokens, ids) if i == UNK_ID and t != UNK]
            if unknown:
                self.warn(f"warning: line {number}: the prefix has {', '.join(map(repr, unknown[:3]))}, which the "
                          "model's vocabulary lacks: forced as <unk> (warned once)")
                self.unknown_prefix = True
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
        """Beam search (or sampling) over non-empty sources, each output starting with its prefix
        when given; results in input order. `search` replaces the configured search options
        (`nmt serve`'s per-request options)."""
        return self.generator.search(sources, search or self.config.search, prefixes)

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


def translate_stream(translator: Translator, source: IO[bytes], source_name: str, out: IO[str],
                     progress: bool = False) -> int:
    """Translate every line of `source` and write each output line to `out`; returns the line
    count. From a pipe or a terminal, what has arrived is translated whenever the input pauses, and
    each chunk's lines are flushed: a program that writes a line and waits for it is answered."""
    from tqdm import tqdm

    count = 0
    with tqdm(unit="line", disable=not (progress and sys.stderr.isatty()), file=sys.stderr) as bar:
        for chunk in arriving_chunks(source, source_name, CHUNK_LINES):
            out.writelines(line + "\n" for line in translator.translate_lines(chunk, count + 1))
            out.flush()
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
            return translate_stream(translator, source, name, sys.stdout)
        remove_stale_temporaries(output_path.parent)
        with replacing(output_path, "the translation") as tmp, open(tmp, "w", encoding="utf-8") as out:
            return translate_stream(translator, source, name, out, progress=input_path is not None)
    finally:
        if input_path:
            source.close()
