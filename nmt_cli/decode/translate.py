"""`nmt translate`: raw text in, raw text out, one output line per input line, in input order.

Input is read in chunks (memory does not grow with the file); within a chunk sentences are sorted
by length and batched by tokens (engine.py), translated, and written back in input order: the
best translation as text, or with `--format jsonl` a record of the n-best and their scores (and
the attention); with `--score-reference`, the score of each line's given target instead. An empty
line gives an empty line. A line longer than the model's positions is truncated with a warning
naming the line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import IO, Any

from nmt_cli.decode.engine import CHUNK_LINES, Engine, model_search
from nmt_cli.decode.records import attention_record, score_record, translations_record
from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.device import select as select_device
from nmt_cli.device import tune
from nmt_cli.errors import NmtError
from nmt_cli.files import destination, reason, remove_stale_temporaries, replacing
from nmt_cli.lines import arriving_chunks, line_count
from nmt_cli.model.checkpoint import load, load_bundle
from nmt_cli.model.released import Released
from nmt_cli.run_config import TranslateConfig


def translate_lines(engine: Engine, lines: list[str], first_number: int = 1,
                    config: TranslateConfig = TranslateConfig()) -> list[str]:
    """The output lines of `lines` as `config` says (text or JSON), numbered from `first_number`
    in warnings and records; with --prefix a line is SOURCE<TAB>PREFIX, with --constraints
    SOURCE<TAB>PHRASE..."""
    if config.score_reference:
        return score_lines(engine, lines, first_number, config.format)
    pairs = [line.partition("\t")[::2] if config.prefix or config.constraints else (line, "") for line in lines]
    prefixes = [prefix for _, prefix in pairs] if config.prefix else None
    constraints = [rest.split("\t") if rest else [] for _, rest in pairs] if config.constraints else None
    sources, found = engine.search([source for source, _ in pairs], engine.config.search, prefixes, first_number,
                                   constraints=constraints, avoid=[list(config.avoid)] * len(lines))
    outputs = []
    for k, hyps in enumerate(found):
        number = first_number + k
        weights, labels = None, None
        if hyps and (config.attention_plot is not None or (config.format == "jsonl" and config.attention)):
            weights, labels = engine.attention(sources[k], hyps[0].tokens), engine.labels(sources[k], hyps[0].tokens)
        if weights is not None and config.attention_plot is not None:
            from nmt_cli.plot import attention_maps

            attention_maps(weights, *labels, config.attention_plot, f"line{number:06d}", config.plot_layers,
                           config.plot_heads)
        if config.format == "text":
            outputs.append(engine.translation(hyps[0]).text if hyps else "")
            continue
        record = translations_record(number, [engine.translation(h, phrases=constraints[k] if constraints else None,
                                                                 number=number) for h in hyps])
        if weights is not None and config.attention:
            record["attention"] = attention_record(weights, config.attention_layer, labels)
        outputs.append(json.dumps(record, ensure_ascii=False))
    return outputs


def score_lines(engine: Engine, lines: list[str], first_number: int, form: str) -> list[str]:
    """--score-reference: each SOURCE<TAB>TARGET line's target log-probability (`form` text), or
    its record (jsonl)."""
    for k, line in enumerate(lines):
        if "\t" not in line:
            raise NmtError(f"line {first_number + k}: --score-reference reads SOURCE<TAB>TARGET lines, and this "
                           "one has no tab")
    sources, targets = zip(*(line.split("\t", 1) for line in lines)) if lines else ((), ())
    scored = engine.score(list(sources), list(targets), first_number)
    if form == "text":
        return [f"{s.log_prob:.6f}" for s in scored]
    return [json.dumps(score_record(first_number + k, s), ensure_ascii=False) for k, s in enumerate(scored)]


def translate_stream(engine: Engine, config: TranslateConfig, source: IO[bytes], source_name: str,
                     out: IO[str], progress: bool = False, total: int | None = None) -> int:
    """Translate every line of `source` as `config` says and write each output line to `out`;
    returns the line count. From a pipe or a terminal, what has arrived is translated whenever the
    input pauses, and each chunk's lines are flushed: a program that writes a line and waits for it
    is answered.
    With `progress` on a terminal, a bar of the lines (of `total`, with an ETA, when known); off a
    terminal (a log), a line after a chunk of CHUNK_LINES lines when PROGRESS_SECONDS have passed
    since the last."""
    from tqdm import tqdm

    count, started = 0, time.monotonic()
    last = started
    with tqdm(unit="line", total=total, disable=not (progress and sys.stderr.isatty()), file=sys.stderr) as bar:
        for chunk in arriving_chunks(source, source_name, CHUNK_LINES):
            out.writelines(line + "\n" for line in translate_lines(engine, chunk, count + 1, config))
            out.flush()
            count += len(chunk)
            bar.update(len(chunk))
            if progress and bar.disable and time.monotonic() - last >= PROGRESS_SECONDS:
                last = time.monotonic()
                print(progress_line(count, total, last - started), file=sys.stderr, flush=True)
    return count


PROGRESS_SECONDS = 60.0


def progress_line(count: int, total: int | None, seconds: float) -> str:
    """How far a translation is, in one line: lines done (of `total`), their rate, the time left."""
    rate = count / max(seconds, 1e-9)
    left = f", about {clock((total - count) / rate)} left" if total and rate else ""
    return (f"nmt translate: {count:,}{f' of {total:,}' if total else ''} lines in {clock(seconds)} "
            f"({rate:.1f} lines/s){left}")


def clock(seconds: float) -> str:
    """H:MM:SS."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def to_stdout(write: Callable[[], int]) -> int:
    """`write()`, whose output goes to stdout; stdout that cannot take it (a full device) is a
    one-line error, a closed pipe a quiet exit, and what stayed in its buffer goes nowhere instead
    of failing again as the interpreter exits."""
    try:
        result = write()
        sys.stdout.flush()
        return result
    except OSError as e:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        if isinstance(e, BrokenPipeError):  # the reader went away (`| head`): end as a shell tool does, quietly
            raise SystemExit(128 + signal.SIGPIPE) from None
        raise NmtError(f"<stdout>: cannot write the translation ({reason(e)})") from None


def model_defaults(checkpoints: Sequence[Path]) -> dict[str, Any]:
    """The search settings of the first of `checkpoints`, which `nmt translate` runs with where no
    flag sets them (an imported release's, else none): --dump-config shows them."""
    return Released.from_dict(load(checkpoints[0]).get("released")).search if checkpoints else {}


def translate_file(checkpoints: list[Path], input_path: Path | None, output_path: Path | None,
                   config: TranslateConfig, given: Collection[str] = (), shortlist: Path | None = None) -> int:
    """The `nmt translate` command: files or stdin/stdout; the output file appears only when
    complete. Search options not `given` are the model's own (`engine.model_search`); with a
    `shortlist` file, each batch's output layer is cut to it."""
    if output_path is not None:
        inputs = [*checkpoints, *filter(None, [input_path, shortlist])]
        output_path = destination(output_path, "translation", "to stream it there, leave out -o: > PATH", inputs)
        if not output_path.parent.is_dir():
            raise NmtError(f"{output_path}: cannot write the translation (no such directory: {output_path.parent})")
    bundles = [load_bundle(path) for path in checkpoints]
    try:
        search = model_search(bundles[0], {name: getattr(config.run.search, name) for name in given})
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, search=search))
    except ValueError as e:
        raise NmtError(f"{checkpoints[0]}: its search settings with these options: {e}") from None
    device, dtype = select_device(config.run.run_on, config.run.precision)
    tune(device, config.run.threads)
    engine = Engine(bundles, config.run, device, dtype, shortlist=shortlist and Shortlist.load(shortlist, bundles[0]))
    source = open(input_path, "rb") if input_path else sys.stdin.buffer
    name = str(input_path) if input_path else "<stdin>"
    if input_path is None and sys.stdin.isatty():
        print("nmt translate: reading lines from the terminal (Ctrl-D ends)", file=sys.stderr, flush=True)
    try:
        if output_path is None:
            return to_stdout(lambda: translate_stream(engine, config, source, name, sys.stdout))
        remove_stale_temporaries(output_path.parent)
        with replacing(output_path, "the translation") as tmp, open(tmp, "w", encoding="utf-8") as out:
            total = line_count(input_path) if input_path and input_path.is_file() else None
            return translate_stream(engine, config, source, name, out, progress=input_path is not None,
                                    total=total)
    finally:
        if input_path:
            source.close()
