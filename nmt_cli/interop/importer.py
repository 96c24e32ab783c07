"""`nmt import`: a released Marian model, or a fairseq or OpenNMT-py checkpoint, as an nmt-cli
checkpoint that translates, serves, scores, exports and fine-tunes like one trained here. Four
formats: a Hugging Face `MarianMTModel` directory (import_transformers.py), Marian's own
(import_marian.py), a fairseq checkpoint file with its dictionaries (import_fairseq.py), and an
OpenNMT-py one (import_onmt.py).

A Marian Transformer is ours (§3) up to three layouts, which the import undoes exactly:
- its sinusoid puts a position's sines first, then its cosines, where §3.5 (and we) interleave
  them: the d_model dimensions of the residual stream are permuted back (export_transformers.py's inverse);
- its special tokens sit anywhere (`</s>` 0 and `<pad>` last in older releases, `</s>` 44670 in
  tc-big ones), the decoder starting from `<pad>`'s row (or, in Marian's own, from zeros): the
  vocabulary rows are reordered to ours (<pad> 0, <s> 1, </s> 2, <unk> 3), <s> taking the start's row;
- its FFN may use swish or GELU, its output projection a bias or a matrix of its own (ModelConfig).
What cannot be represented (learned positions, an embedding layer norm, ...) is refused in one
line naming it. The released decoding settings become the checkpoint's search defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.errors import NmtError
from nmt_cli.files import not_read, reads_recorded
from nmt_cli.interop.formats import READERS, reader_for
from nmt_cli.interop.import_fairseq import read_fairseq
from nmt_cli.interop.import_onmt import read_onmt
from nmt_cli.interop.reading import load_pickled
from nmt_cli.interop.release import Release
from nmt_cli.model.checkpoint import checked_model, description, save
from nmt_cli.model.released import Released
from nmt_cli.run_config import ImportConfig
from nmt_cli.text.vocab import Vocabulary


def import_model(source: Path, out: Path, warn: Callable[[str], None] = print,
                 options: ImportConfig | None = None) -> dict[str, Any]:
    """Read the release at `source` with the reader formats.py's table chooses for it (with
    `options`, where it takes them), write it to `out` as a checkpoint (atomically), and return
    that checkpoint."""
    source, options = Path(source), options or ImportConfig()
    given = [f.name for f in dataclasses.fields(options) if getattr(options, f.name) is not None]
    try:
        reader = reader_for(source)
    except NmtError:
        if not given:
            raise
        reader = None  # what takes the options given is named first
    for name in given:
        if reader is None or name not in reader.options:
            takers = " or ".join(r.summary for r in READERS if name in r.options)
            raise NmtError(f"--{name.replace('_', '-')}: only {takers} takes it; {source} is not one")
    assert reader is not None
    with reads_recorded() as reads:
        release = reader.entry()(source, options, warn)
    not_read(out, reads, "import")
    checkpoint = checkpoint_of(release)
    checked_model(checkpoint, source)  # what could be wrong came from the release: its name in the error
    save(checkpoint, out)
    return checkpoint


def read_checkpoint_file(path: Path, options: ImportConfig, warn: Callable[[str], None]) -> Release:
    """A fairseq or OpenNMT-py checkpoint, told apart by what it holds (OpenNMT-py's: its vocabularies
    and options)."""
    state = load_pickled(path)
    if "vocab" in state and "opt" in state:
        return read_onmt(path, state, options, warn)
    return read_fairseq(path, state, options)


def checkpoint_of(release: Release) -> dict[str, Any]:
    """Our checkpoint of `release`: dimensions interleaved again, rows in our vocabulary's order."""
    order = torch.arange(release.config.d_model) if release.order is None else torch.argsort(release.order)
    src_rows, src_tokens = release.source.rows()
    tgt_rows, tgt_tokens = release.target.rows()
    rows = {"src_embed": torch.tensor(src_rows), "tgt_embed": torch.tensor(tgt_rows),
            "output_projection": torch.tensor(tgt_rows)}
    weights: dict[str, Tensor] = {}
    for name in list(release.weights):  # each released tensor let go once converted: one model's memory, not two
        by_token = name.endswith("tokens.weight") or name.startswith("output_projection")
        weights[name] = permuted(name, release.weights.pop(name).float(), order,
                                 rows.get(name.split(".")[0]) if by_token else None)
    if release.shared:
        weights["src_embed.tokens.weight"] = weights["tgt_embed.tokens.weight"]
    if release.config.tied_output:
        weights["output_projection.weight"] = weights["tgt_embed.tokens.weight"]
    return description(release.config, weights, release.shared, release.text, release.bpe_codes,
                       Vocabulary(src_tokens), Vocabulary(tgt_tokens), release.source_spm,
                       None if release.target_spm == release.source_spm else release.target_spm,
                       Released(release.search, tuple(release.never_output), release.origin))


# Where a weight reads the residual stream (its input dimension) or writes it (its output
# dimension, biases and layer norms), by the ending of its name.
_READS = (".qkv.weight", ".q.weight", ".kv.weight", ".w1.weight", "tokens.weight", "output_projection.weight",
          "learned.weight")  # (a table of positions: a row per position, written into the stream)
_WRITES = (".out.weight", ".out.bias", ".w2.weight", ".w2.bias", "norm.weight", "norm.bias")


def permuted(name: str, tensor: Tensor, order: Tensor, rows: Tensor | None) -> Tensor:
    """`tensor` (of our parameter `name`) with its d_model dimension in our order and, where it has
    a row per token, its `rows` in our vocabulary's order: a copy of its own, made in blocks of
    rows (a vocabulary's matrix is the largest: no second copy of it, however briefly)."""
    if name.endswith(_WRITES):
        return tensor[order]
    reads = name.endswith(_READS)
    if rows is None:
        return tensor[:, order] if reads else tensor.clone()
    out = tensor.new_empty(len(rows), *tensor.shape[1:])
    for start in range(0, len(rows), ROWS_AT_ONCE):
        block = tensor.index_select(0, rows[start:start + ROWS_AT_ONCE])
        out[start:start + ROWS_AT_ONCE] = block[:, order] if reads else block
    return out


ROWS_AT_ONCE = 4096
