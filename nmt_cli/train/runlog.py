"""What a training run reports: messages on stderr, `train_log.jsonl` (and TensorBoard scalars
with --tensorboard), and a progress bar on a terminal. Only the main process writes."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from nmt_cli.errors import NmtError
from nmt_cli.files import reason, write_text

# The bar of a run with only --max-time: seconds of its budget, with the update reached.
TIME_BAR = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"
REPORT_SECONDS = 60.0  # a slow run (a large model on a CPU) reports at least this often, and after its first update


class RunLog:
    """The reports of one `nmt train` process (silent unless `main`)."""

    def __init__(self, save_dir: Path, main: bool, tensorboard: bool, progress_bar: bool) -> None:
        self.path, self.main, self.progress_bar = Path(save_dir) / "train_log.jsonl", main, progress_bar
        self.tensorboard = None
        if tensorboard and main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise NmtError("--tensorboard needs the tensorboard package: pip install 'nmt-cli[tensorboard]' "
                               "(or pip install tensorboard)") from None
            self.tensorboard = SummaryWriter(str(Path(save_dir) / "tensorboard"))
        self.bar: Any = None
        self.window = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "start": time.monotonic()}
        self.reported = False  # this run has reported an update

    def due(self, update: int, interval: int) -> bool:
        """Whether to report at `update`: every --log-interval updates, after the run's first one,
        and whenever REPORT_SECONDS passed since the last report."""
        return update % interval == 0 or not self.reported or \
            time.monotonic() - self.window["start"] >= REPORT_SECONDS

    def log(self, message: str) -> None:
        """A line on stderr, above the progress bar when there is one."""
        if not self.main:
            return
        if self.bar is not None and not self.bar.disable:
            self.bar.write(f"nmt train: {message}", file=sys.stderr)
        else:
            print(f"nmt train: {message}", file=sys.stderr, flush=True)

    def record(self, entry: dict[str, Any]) -> None:
        """One line of train_log.jsonl (and TensorBoard scalars with --tensorboard)."""
        if not self.main:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError as e:
            raise NmtError(f"{self.path}: cannot write the training log ({reason(e)}); the checkpoints written "
                           "so far are intact: make room and run the same command to resume") from None
        if self.tensorboard is not None:
            for key, value in entry.items():
                if key not in ("kind", "update", "epoch"):
                    self.tensorboard.add_scalar(f"{entry['kind']}/{key}", value, entry["update"])

    def validation(self, update: int, epoch: int, elapsed: float, result: dict[str, float], best: bool) -> None:
        """Record and show a validation's result."""
        self.record({"kind": "valid", "update": update, "epoch": epoch, "elapsed_s": round(elapsed, 1), **result})
        bleu = f", BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}, TER {result['ter']:.2f}" \
            if "bleu" in result else ""
        self.log(f"validation at update {update}: loss {result['loss']:.3f}, nll {result['nll']:.3f}, "
                 f"ppl {result['ppl']:.2f}{bleu}" + (" (best)" if best else ""))

    def truncate(self, updates: int) -> None:
        """Drop records newer than update `updates`, the checkpoint resumed from (they will be redone)."""
        if not self.main or not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _update_of(line) <= updates]
        if len(kept) != len(lines):
            write_text(self.path, "".join(kept))

    def start(self, updates: int | None, initial: int, seconds: float | None, elapsed: float) -> None:
        """Open the progress bar (a terminal only) and the first window of training statistics. The
        bar counts updates toward `updates` (--max-updates); with only a time budget (`seconds`) it
        counts seconds, so that it has a percentage and an ETA."""
        from tqdm import tqdm

        self.timed = updates is None and seconds is not None
        options = {"total": seconds, "initial": round(elapsed), "bar_format": TIME_BAR} if self.timed else \
            {"total": updates, "initial": initial, "unit": "upd"}
        self.bar = tqdm(dynamic_ncols=True, file=sys.stderr,
                        disable=not (self.main and self.progress_bar and sys.stderr.isatty()), **options)
        self.window.update(loss=0.0, nll=0.0, tokens=0.0, start=time.monotonic())

    def count(self, stats: dict[str, float], update: int, elapsed: float) -> None:
        """Add an update's loss, NLL and tokens to the window; move the bar."""
        for key in ("loss", "nll", "tokens"):
            self.window[key] += stats[key]
        if self.timed:
            self.bar.set_description_str(f"update {update}", refresh=False)
            self.bar.update(min(round(elapsed), self.bar.total) - self.bar.n)
        else:
            self.bar.update(1)

    def close_bar(self) -> None:
        """Take the bar off the terminal (before the run's last words, which it would be redrawn after)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def report(self, update: int, epoch: int, lr: float, elapsed: float, world: int) -> None:
        """Record and show the window's averages (when `due`), then start a new one."""
        window, now = self.window, time.monotonic()
        tokens = max(window["tokens"], 1.0)
        entry = {"kind": "train", "update": update, "epoch": epoch,
                 "loss": window["loss"] / tokens, "nll": window["nll"] / tokens,
                 "ppl": math.exp(min(window["nll"] / tokens, 50)), "lr": lr,
                 "tokens_per_s": window["tokens"] * world / (now - window["start"]),
                 "elapsed_s": round(elapsed, 1)}
        self.record(entry)
        summary = f"loss {entry['loss']:.3f} ppl {entry['ppl']:.2f} lr {lr:.2e} {entry['tokens_per_s']:,.0f} tok/s"
        if self.bar.disable:
            self.log(f"update {update} epoch {epoch}: {summary}")
        else:
            self.bar.set_postfix_str(summary)
        window.update(loss=0.0, nll=0.0, tokens=0.0, start=now)
        self.reported = True

    def close(self) -> None:
        self.close_bar()
        if self.tensorboard is not None:
            self.tensorboard.close()


def _update_of(log_line: str) -> float:
    """The update number of a train_log.jsonl line; a torn line (killed mid-write) counts as newest."""
    try:
        return json.loads(log_line)["update"]
    except (ValueError, KeyError, TypeError):
        return math.inf
