"""Pictures: attention heat maps (§4 and the paper's appendix) and training curves.

matplotlib is an optional extra (`pip install nmt-cli[plot]`); it draws off-screen (Agg).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt_cli.errors import NmtError
from nmt_cli.files import destination, reason, replacing, temporary

LOG = "train_log.jsonl"  # a save directory's log, as nmt train writes it (train/runlog.py)
KINDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
         "cross": "encoder-decoder attention"}


def pyplot() -> Any:
    """matplotlib.pyplot with the off-screen backend, or a clear error saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise NmtError("pictures need matplotlib: pip install 'nmt-cli[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def attention_maps(weights: dict[str, list[torch.Tensor]], src_tokens: list[str], tgt_tokens: list[str],
                   out_dir: Path, name: str, layers: Sequence[int] | None = None,
                   heads: Sequence[int] | None = None) -> list[Path]:
    """One PNG per attention kind and layer: a panel per chosen head and one averaged over all heads.

    `weights` comes from `Transformer.attention_weights` for one sentence (batch size 1); layers and
    heads are numbered from 1. Decoder queries are the output tokens (`tgt_tokens`, ending in </s>),
    decoder keys the inputs the decoder saw (<s> then all but the last output token).
    """
    plt = pyplot()
    tgt_inputs = ["<s>"] + tgt_tokens[:-1]
    axes_labels = {"encoder": (src_tokens, src_tokens), "decoder": (tgt_tokens, tgt_inputs),
                   "cross": (tgt_tokens, src_tokens)}
    written = []
    for kind, per_layer in weights.items():
        chosen_layers = layers or range(1, len(per_layer) + 1)
        for layer in chosen_layers:
            if not 1 <= layer <= len(per_layer):
                raise NmtError(f"--layers {layer}: the model has {len(per_layer)} layers")
            matrix = per_layer[layer - 1][0].float().cpu()  # (heads, queries, keys)
            chosen = heads or range(1, matrix.size(0) + 1)
            panels = [(f"head {h}", matrix[h - 1]) for h in chosen] + [("mean of heads", matrix.mean(0))]
            rows, cols = _grid(len(panels))
            queries, keys = axes_labels[kind]
            size = max(2.5, 0.28 * max(len(queries), len(keys)))
            fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1, rows * size + 0.6), squeeze=False)
            for ax, (title, panel) in zip(axes.flat, panels):
                ax.imshow(panel.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
                ax.set_title(title, fontsize=9)
                ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
                ax.set_yticks(range(len(queries)), queries, fontsize=7)
            for ax in list(axes.flat)[len(panels):]:
                ax.axis("off")
            fig.suptitle(f"{KINDS[kind]}, layer {layer}", fontsize=10)
            fig.tight_layout()
            path = out_dir / f"{name}.{kind}.layer{layer}.png"
            save_figure(fig, path)
            written.append(path)
    return written


def plot_directory(path: Path) -> None:
    """Make the --attention-plot directory and write in it once: a directory that cannot hold the
    plots is refused in one line before anything is translated."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = temporary(path / "probe")
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise NmtError(f"--attention-plot {path}: cannot write the plots there ({reason(e)})") from None


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return math.ceil(n / cols), cols


def read_log(save_dir: Path) -> list[dict[str, Any]]:
    path = Path(save_dir) / LOG
    if not path.exists():
        raise NmtError(f"{path}: not found; is {save_dir} a save directory of `nmt train`?")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise NmtError(f"{path}:{number}: not a JSON record") from None
    return records


def training_curves(save_dirs: Sequence[Path], output: Path) -> Path:
    """Loss and perplexity (and validation BLEU when logged) against updates and wall time,
    one line per run and split, read from each save directory's train_log.jsonl."""
    out = destination(output, "plot", inputs=[Path(d) / LOG for d in save_dirs])
    plt = pyplot()
    runs = [(Path(d).name or str(d), read_log(d)) for d in save_dirs]
    has_bleu = any("bleu" in r for _, records in runs for r in records)
    panels = ["loss", "ppl"] + (["bleu"] if has_bleu else [])
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for row, metric in enumerate(panels):
        for col, (x_key, x_label) in enumerate((("update", "updates"), ("elapsed_s", "training minutes"))):
            ax = axes[row][col]
            for name, records in runs:
                for kind, style in (("train", "-"), ("valid", "o-")):
                    points = [(r[x_key], r[metric]) for r in records if r.get("kind") == kind and metric in r]
                    if not points:
                        continue
                    xs, ys = zip(*points)
                    xs = [x / 60 for x in xs] if x_key == "elapsed_s" else xs
                    ax.plot(xs, ys, style, markersize=3, label=f"{name} {kind}")
            ax.set_xlabel(x_label)
            ax.set_ylabel(metric)
            if metric == "ppl":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out)
    return output


def save_figure(fig: Any, path: Path) -> None:
    """Write `fig` as a PNG, atomically; a failure is one line naming the file and the reason."""
    import matplotlib.pyplot as plt

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path, "plot") as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    except OSError as e:
        raise NmtError(f"{path.parent}: cannot write the plot there ({reason(e)})") from None
    finally:
        plt.close(fig)
