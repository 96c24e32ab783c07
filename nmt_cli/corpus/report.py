"""What the commands show besides their output: `nmt preprocess`'s progress on a terminal (each
stage's sentence pairs out of its total) and its counts of every split when done; `nmt info`'s
table."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from nmt_cli.config import PreprocessConfig

if TYPE_CHECKING:
    from tqdm import tqdm

    from nmt_cli.corpus.datadir import DataDir


def show_progress(opts: PreprocessConfig) -> bool:
    """Progress bars on a terminal only (logs and captured output stay clean)."""
    return opts.progress and sys.stderr.isatty()


def bar(opts: PreprocessConfig, desc: str, total: Callable[[], int]) -> tqdm:
    """A stage's progress bar in sentence pairs, out of `total()` (counted only when shown)."""
    from tqdm import tqdm

    shown = show_progress(opts)
    return tqdm(desc=desc, unit="pair", total=total() if shown else None, disable=not shown)


def print_summary(data: DataDir) -> None:
    """The counts of every split in a table that fits 80 columns, then what was dropped and the
    seconds of each stage."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    meta, src, tgt = data.meta, data.text.source_lang, data.text.target_lang
    table = Table(title=f"nmt preprocess {src}-{tgt}: vocabulary {meta['vocab_sizes'][src]:,}"
                        f" / {meta['vocab_sizes'][tgt]:,}", box=box.SIMPLE_HEAD)
    for column in ("split", "pairs", f"tokens {src}", f"tokens {tgt}", f"unk {src}", f"unk {tgt}", "s"):
        table.add_column(column, justify="left" if column == "split" else "right", no_wrap=True)
    dropped = []
    for name, s in meta["splits"].items():
        table.add_row(name, f"{s['pairs_out']:,}", *(f"{s['tokens'].get(lang, 0):,}" for lang in (src, tgt)),
                      *(f"{s['unk_rate'][lang]:.2%}" for lang in (src, tgt)), f"{s['seconds']:.1f}")
        if s["dropped"]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in s["dropped"].items())
            dropped.append(f"{name}: {sum(s['dropped'].values()):,} of {s['pairs_in']:,} pairs dropped ({reasons})")
    console = Console(stderr=True)
    console.print(table)
    for line in dropped:
        console.print(line)
    console.print("stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["timings"].items()))


FILTERS = {"length_ratio": ("max_len_ratio", "--max-len-ratio", "sides whose token counts differ by more than that"),
           "too_long": ("max_len", "--max-len", "a side longer than that many tokens")}


def filter_warnings(data: DataDir) -> list[str]:
    """A line for each filter that dropped more than a tenth of the training pairs, naming its flag."""
    train = data.meta["splits"].get("train")
    if train is None:
        return []
    unit, lines = "SentencePiece pieces" if data.text.sentencepiece else "Moses words", []
    for reason, (key, flag, why) in FILTERS.items():
        dropped, read = train["dropped"].get(reason, 0), train["pairs_in"]
        if dropped > read / 10:
            lines.append(f"warning: {dropped:,} of {read:,} training pairs ({dropped / read:.0%}) dropped by {flag} "
                         f"{data.meta['filter'][key]:g} ({why}, in {unit}): raise it where the languages' or "
                         "subwords' lengths differ")
    return lines


def print_table(title: str, rows: Iterable[tuple[str, str]]) -> None:
    """A two-column table of names and values (`nmt info`)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
