"""`nmt preprocess`: raw parallel text to a self-describing data directory.

Stages, each streamed (memory does not grow with the corpus, only with its word vocabulary):
1. read the training pairs; tokenize them, drop unusable pairs and count words (workers);
2. learn joint BPE codes from the word counts (`bpe.learn_bpe`: subword-nmt's codes; one process);
3. segment each distinct training word once and count subwords (workers), build the vocabulary;
4. apply BPE (once per distinct word) and binarize every split (workers). Only the training split
   is filtered.
Everything is written to a temporary directory that is renamed into place at the end.
"""

from __future__ import annotations

import functools
import gc
import gzip
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from nmt_cli import NmtError, __version__
from nmt_cli.bpe import learn_bpe
from nmt_cli.data import ArrayWriter, token_dtype
from nmt_cli.files import (
    MARKER,
    DirectoryLock,
    publish_directory,
    reason,
    remove_stale_temporaries,
    temporary_directory,
)
from nmt_cli.text import (
    TextConfig,
    TextProcessor,
    check_codes,
    chunks,
    decode_lines,
    subword_counts,
)
from nmt_cli.vocab import SPECIALS, UNK_ID, Vocabulary

FORMAT_VERSION = 1
CHUNK_LINES = 250  # small enough that a 1,000-line test set still keeps every worker busy
# The training split's chunks are larger: each chunk costs the parent CPU time in its pool's
# threads (sending, receiving), and the one parent feeds every worker (preprocess_speed.py).
TRAIN_CHUNK_LINES = 1000
CHUNK_WORDS = 2000
# A training line with more characters than this times --max-len cannot fit in --max-len tokens in
# practice; it is dropped as too long without running the tokenizer over it (a 1 MB line, say).
MAX_CHARS_PER_TOKEN = 100


@dataclass
class PreprocessOptions:
    text: TextConfig
    destdir: Path
    trainpref: str | None = None
    validpref: str | None = None
    testprefs: tuple[str, ...] = ()
    bpe_merges: int = 32000
    bpe_codes: Path | None = None
    joined_dictionary: bool = True
    srcdict: Path | None = None
    tgtdict: Path | None = None
    vocab_min_count: int = 1
    vocab_size: int | None = None
    padding_factor: int = 8
    max_len: int = 250
    max_len_ratio: float = 1.5
    workers: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    force: bool = False
    progress: bool = True


def reuse_options(data_dir: Path, src: str, tgt: str) -> tuple[TextConfig, dict[str, Any]]:
    """Tokenizer settings, BPE codes and vocabularies of an existing data directory."""
    meta = load_meta(data_dir, verify=True)
    text = TextConfig.from_dict(meta["text"])
    if (text.source_lang, text.target_lang) != (src, tgt):
        raise NmtError(f"{data_dir}: prepared for {text.source_lang}-{text.target_lang}, not {src}-{tgt}")
    codes = meta.get("bpe_codes")
    return text, {"bpe_codes": data_dir / codes if codes else None, "bpe_merges": 0,
                  "srcdict": data_dir / meta["dictionaries"][src], "tgtdict": data_dir / meta["dictionaries"][tgt]}


META_KEYS = ("text", "bpe_codes", "joined_dictionary", "dictionaries", "dtype", "splits", "checksums")


def load_meta(data_dir: Path, verify: bool = False) -> dict[str, Any]:
    """The `meta.json` of a data directory made by `nmt preprocess`; with `verify`, every file it
    lists is checked against its sha256 (a truncated, edited or missing file is refused)."""
    path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found; is {data_dir} a directory made by `nmt preprocess`?") from None
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise NmtError(f"{path}: data format version {version}, "
                       f"this nmt-cli reads version {FORMAT_VERSION}; run `nmt preprocess` again")
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise NmtError(f"{path}: incomplete (no {missing[0]!r}); run `nmt preprocess` again")
    if verify:
        for name, digest in meta["checksums"].items():
            file = Path(data_dir) / name
            if not file.is_file():
                raise NmtError(f"{file}: missing from the data directory; run `nmt preprocess` again")
            if sha256(file) != digest:
                raise NmtError(f"{file}: differs from the checksum in meta.json (truncated, edited or corrupt); "
                               "run `nmt preprocess` again")
    return meta


# ---------------------------------------------------------------------------- reading

def input_path(prefix: str, lang: str) -> Path:
    """`PREFIX.LANG`, or `PREFIX.LANG.gz` when only that exists."""
    path = Path(f"{prefix}.{lang}")
    if not path.exists() and Path(f"{path}.gz").exists():
        return Path(f"{path}.gz")
    if not path.is_file():
        raise NmtError(f"{path}: no such file")
    return path


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a (possibly gzipped) file; invalid UTF-8 is an error naming the line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        yield from decode_lines(f, str(path))


def read_pairs(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """Aligned lines of two files; a difference in line counts is an error naming both files."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    number = 0
    for number, s in enumerate(src_lines, start=1):
        t = next(tgt_lines, None)
        if t is None:
            raise NmtError(f"{tgt}:{number}: file ends here, but {src} has more lines (line counts differ)")
        yield s, t
    if next(tgt_lines, None) is not None:
        raise NmtError(f"{src}:{number + 1}: file ends here, but {tgt} has more lines (line counts differ)")


# ---------------------------------------------------------------------------- workers

_worker: dict[str, Any] = {}
WARM_UP_LINE = 'A "warm-up" line: 1,000 words (and more) - it\'s here.'


def _init_worker(text: TextConfig, src_vocab: list[str] | None = None, tgt_vocab: list[str] | None = None,
                 dtype: np.dtype | None = None, segmenter: TextProcessor | None = None,
                 word_counts: tuple[Counter, Counter] | None = None) -> None:
    """The state of a stage's workers, built in the parent and inherited by the forked workers.
    `segmenter`: the processor holding the BPE codes (and, in stage 4, every training word
    segmented already), whose BPE the workers share instead of each parsing the codes again."""
    _worker.update(dtype=dtype, word_counts=word_counts)
    _worker["src"] = TextProcessor(text, text.source_lang)
    _worker["tgt"] = TextProcessor(text, text.target_lang)
    if segmenter is not None:
        _worker["src"].bpe = _worker["tgt"].bpe = segmenter.bpe
    _worker["src_ids"] = WordIds(_worker["src"], Vocabulary(src_vocab)) if src_vocab is not None else None
    _worker["tgt_ids"] = WordIds(_worker["tgt"], Vocabulary(tgt_vocab)) if tgt_vocab is not None else None
    for processor in (_worker["src"], _worker["tgt"]):  # compile the tokenizer's regexes before forking
        processor.tokenize(WARM_UP_LINE)


class WordIds:
    """Words -> subword ids, each distinct word segmented and looked up once. Exact, because BPE
    segments every word on its own: a line's ids are its words' ids back to back."""

    def __init__(self, processor: TextProcessor, vocab: Vocabulary) -> None:
        self.processor, self.vocab = processor, vocab
        self.cache: dict[str, list[int]] = {}

    def encode(self, words: list[str]) -> list[int]:
        ids: list[int] = []
        cache = self.cache
        for word in words:
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = cache[word] = self.vocab.encode(self.processor.segment([word]))
            ids.extend(word_ids)
        return ids


@dataclass
class TokenizedChunk:
    """Stage 1's result for a chunk of training pairs, ready for the parent to append: the kept
    pairs' tokenized lines, their word counts, and why the others were dropped."""

    lines: tuple[bytes, bytes]
    words: tuple[Counter, Counter]
    kept: int
    dropped: Counter


def _tokenize_chunk(pairs: list[tuple[str, str]], max_len: int, max_ratio: float) -> TokenizedChunk:
    """Tokenize and filter raw training pairs. A pair with a NUL byte, or too long to fit in
    `max_len` tokens, is dropped before tokenizing it. Filtering, joining and counting happen
    here, not in the parent, which would otherwise hold every worker back (one process feeds them all)."""
    src, tgt = _worker["src"], _worker["tgt"]
    max_chars = MAX_CHARS_PER_TOKEN * max_len
    lines: tuple[list[str], list[str]] = ([], [])
    words: tuple[list[str], list[str]] = ([], [])
    dropped: Counter = Counter()
    for s, t in pairs:
        if "\x00" in s or "\x00" in t:
            reason: str | None = "nul_byte"
        elif max(len(s), len(t)) > max_chars:
            reason = "too_long"
        else:
            pair = src.tokenize(s), tgt.tokenize(t)
            reason = drop_reason(*pair, max_len, max_ratio)
        if reason:
            dropped[reason] += 1
            continue
        for side, side_lines, side_words in zip(pair, lines, words):
            side_lines.append(" ".join(side))
            side_words.extend(side)
    return TokenizedChunk(tuple("".join(f"{line}\n" for line in side).encode("utf-8") for side in lines),
                          (Counter(words[0]), Counter(words[1])), len(lines[0]), dropped)


def _segment_words(words: list[str]) -> tuple[dict[str, tuple[str, ...]], Counter, Counter]:
    """Stage 3 in a worker: distinct training words -> their BPE cache entries, and the subword
    counts they make on each side (the word counts come with the inherited state)."""
    processor = _worker["src"]
    segmentations = processor.segmentations(words)
    src, tgt = (subword_counts(processor, {w: side[w] for w in words if w in side}) for side in _worker["word_counts"])
    return segmentations, src, tgt


@dataclass
class Packed:
    """A chunk's ids per side, concatenated, with sentence lengths: the parent only appends bytes."""

    ids: tuple[np.ndarray, np.ndarray]
    lengths: tuple[np.ndarray, np.ndarray]
    unknown: tuple[int, int]
    too_long: int


def _binarize_chunk(pairs: list[tuple[str, str]], tokenize: bool, max_len: int | None) -> Packed:
    """Lines -> (tokenize, unless done already) -> BPE -> ids, packed; pairs over max_len are dropped."""
    src, tgt = _worker["src"], _worker["tgt"]
    sides: tuple[list[list[int]], list[list[int]]] = ([], [])
    too_long = 0
    for s, t in pairs:
        words = (src.tokenize(s), tgt.tokenize(t)) if tokenize else (s.split(), t.split())
        s_ids, t_ids = _worker["src_ids"].encode(words[0]), _worker["tgt_ids"].encode(words[1])
        if max_len is not None and max(len(s_ids), len(t_ids)) > max_len:
            too_long += 1
            continue
        sides[0].append(s_ids)
        sides[1].append(t_ids)
    (src_ids, src_lengths), (tgt_ids, tgt_lengths) = _pack(sides[0]), _pack(sides[1])
    return Packed((src_ids, tgt_ids), (src_lengths, tgt_lengths),
                  (int((src_ids == UNK_ID).sum()), int((tgt_ids == UNK_ID).sum())), too_long)


def _pack(sentences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ids back to back (in the data's dtype) and the length of each sentence."""
    lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
    ids = np.fromiter(itertools.chain.from_iterable(sentences), _worker["dtype"], int(lengths.sum()))
    return ids, lengths


@dataclass(frozen=True)
class LineRange:
    """`lines` consecutive lines of two aligned files, starting at these byte offsets."""

    src: Path
    tgt: Path
    src_offset: int
    tgt_offset: int
    lines: int

    def read(self) -> list[tuple[str, str]]:
        with open(self.src, "rb") as fs, open(self.tgt, "rb") as ft:
            fs.seek(self.src_offset)
            ft.seek(self.tgt_offset)
            return [(fs.readline().decode("utf-8").rstrip("\n"), ft.readline().decode("utf-8").rstrip("\n"))
                    for _ in range(self.lines)]


def _binarize_range(lines: LineRange, max_len: int) -> Packed:
    """Tokenized training lines, read by the worker itself (the parent sends only offsets)."""
    return _binarize_chunk(lines.read(), tokenize=False, max_len=max_len)


def _leave_signals_to_parent() -> None:
    """In a worker: Ctrl-C reaches the whole process group, but only the parent reports it and
    cleans up; it ends the workers with SIGTERM, which ends them silently."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Workers:
    """`workers` processes given `_init_worker(**state)` once (or this process when workers == 1),
    mapping a function over chunks in order, with a bounded number of chunks in flight."""

    def __init__(self, workers: int, **state: Any) -> None:
        self.workers, self.state = workers, state
        self.pool: Any = None

    def __enter__(self) -> Workers:
        _init_worker(**self.state)  # in this process; forked workers inherit it, caches included
        if self.workers > 1:
            # The workers' garbage collector would otherwise walk every object inherited from this
            # process, writing to (and so copying) nearly all its pages: in stage 4 on Multi30k,
            # 16,000 page faults and 0.14 s per worker, a third of its time.
            gc.freeze()
            try:
                self.pool = multiprocessing.get_context("fork").Pool(self.workers, initializer=_leave_signals_to_parent)
            finally:
                gc.unfreeze()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate()

    def map(self, fn: Callable, items: Iterable[Any]) -> Iterator[Any]:
        if self.pool is None:
            yield from map(fn, items)
            return
        pending: deque = deque()
        for item in items:
            pending.append(self.pool.apply_async(fn, (item,)))
            if len(pending) >= 4 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---------------------------------------------------------------------------- stages

@dataclass
class SplitStats:
    pairs_in: int = 0
    pairs_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)
    unknown: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def to_dict(self, src: str, tgt: str) -> dict[str, Any]:
        unk_rate = {lang: self.unknown[lang] / max(1, self.tokens[lang]) for lang in (src, tgt)}
        return {"pairs_in": self.pairs_in, "pairs_out": self.pairs_out, "dropped": dict(self.dropped),
                "tokens": dict(self.tokens), "unk_rate": unk_rate, "seconds": round(self.seconds, 3)}


def drop_reason(src: list[str], tgt: list[str], max_len: int, max_ratio: float) -> str | None:
    """Why a training pair is unusable: an empty side, too long, or too unequal in length."""
    if not src or not tgt:
        return "empty"
    if len(src) > max_len or len(tgt) > max_len:
        return "too_long"
    if max(len(src), len(tgt)) / min(len(src), len(tgt)) > max_ratio:
        return "length_ratio"
    return None


def show_progress(opts: PreprocessOptions) -> bool:
    """Progress bars on a terminal only (logs and captured output stay clean)."""
    return opts.progress and sys.stderr.isatty()


def check_training_left(stats: dict[str, SplitStats], inputs: dict[str, tuple[Path, Path]]) -> None:
    """An empty training set after filtering is an error, not a model trained on nothing."""
    train = stats.get("train")
    if train is not None and train.pairs_in - sum(train.dropped.values()) <= 0:
        raise NmtError(f"{inputs['train'][0]}: no training pair is left after filtering "
                       f"({train.pairs_in} read, dropped: {dict(train.dropped) or 'none'})")


def tokenize_train(opts: PreprocessOptions, src_path: Path, tgt_path: Path, work: Path,
                   stats: SplitStats) -> tuple[Counter, Counter, list[LineRange]]:
    """Stage 1: tokenized, filtered training pairs to `work/train.tok.*`; returns word counts and
    where each chunk of lines starts in the two files (so stage 4's workers read them directly)."""
    src_words: Counter = Counter()
    tgt_words: Counter = Counter()
    ranges: list[LineRange] = []
    src_tok, tgt_tok = (work / f"train.tok.{lang}" for lang in (opts.text.source_lang, opts.text.target_lang))
    tokenize = functools.partial(_tokenize_chunk, max_len=opts.max_len, max_ratio=opts.max_len_ratio)
    with open(src_tok, "wb") as fs, open(tgt_tok, "wb") as ft, Workers(opts.workers, text=opts.text) as workers:
        results = workers.map(tokenize, chunks(read_pairs(src_path, tgt_path), TRAIN_CHUNK_LINES))
        for chunk in tqdm(results, desc="tokenize train", unit="kline", disable=not show_progress(opts)):
            stats.pairs_in += chunk.kept + chunk.dropped.total()
            stats.dropped.update(chunk.dropped)
            if chunk.kept:
                ranges.append(LineRange(src_tok, tgt_tok, fs.tell(), ft.tell(), chunk.kept))
                fs.write(chunk.lines[0])
                ft.write(chunk.lines[1])
                src_words.update(chunk.words[0])
                tgt_words.update(chunk.words[1])
    return src_words, tgt_words, ranges


def binarize(items: Iterable[Any], encode: Callable[[Any], Packed], workers: Workers, prefix: Path,
             dtype: np.dtype, stats: SplitStats, desc: str, training: bool, opts: PreprocessOptions) -> None:
    """Stage 4 for one split: `encode` each item in the workers, append the ids to
    `prefix.{src,tgt}.bin/.idx` in order. Training pairs were counted in stage 1."""
    src, tgt = opts.text.source_lang, opts.text.target_lang
    writers = {src: ArrayWriter(Path(f"{prefix}.{src}"), dtype), tgt: ArrayWriter(Path(f"{prefix}.{tgt}"), dtype)}
    try:
        for packed in tqdm(workers.map(encode, items), desc=desc, unit="chunk", disable=not show_progress(opts)):
            kept = len(packed.lengths[0])
            stats.pairs_in += 0 if training else kept
            stats.pairs_out += kept
            if packed.too_long:
                stats.dropped["too_long"] += packed.too_long
            for lang, ids, lengths, unknown in zip((src, tgt), packed.ids, packed.lengths, packed.unknown):
                writers[lang].extend(ids, lengths)
                stats.tokens[lang] += len(ids)
                stats.unknown[lang] += unknown
    finally:
        for writer in writers.values():
            writer.close()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_destdir(destdir: Path, force: bool, inputs: list[Path]) -> None:
    """Refuse a destination that is not empty (without --force), that holds an input, or that
    --force would empty of files nmt did not write (a directory that is not an earlier output)."""
    if destdir.exists() and not destdir.is_dir():
        raise NmtError(f"{destdir}: exists and is not a directory")
    if Path.cwd().resolve().is_relative_to(destdir):
        raise NmtError(f"{destdir}: is the current directory or holds it; choose a new --destdir")
    for path in inputs:
        if path.resolve().is_relative_to(destdir):
            raise NmtError(f"{destdir}: holds the input {path}; choose another --destdir")
    if not destdir.exists() or not any(destdir.iterdir()):
        return
    if not force:
        raise NmtError(f"{destdir}: exists and is not empty (use --force to replace it)")
    ours = {"meta.json"}
    try:
        ours |= set(json.loads((destdir / "meta.json").read_text(encoding="utf-8"))["checksums"])
    except (OSError, ValueError, KeyError, TypeError):
        raise NmtError(f"{destdir}: --force replaces only a directory made by `nmt preprocess`, and this one "
                       "has no readable meta.json; remove it yourself or choose another --destdir") from None
    foreign = sorted(p.name for p in destdir.iterdir() if p.name not in ours)
    if foreign:
        raise NmtError(f"{destdir}: --force would delete {', '.join(foreign[:3])}"
                       f"{' and more' if len(foreign) > 3 else ''}, which nmt did not write; move them first")


def preprocess(opts: PreprocessOptions) -> dict[str, Any]:
    """Run every stage; returns the metadata written to `meta.json`."""
    if opts.trainpref is None and (opts.srcdict is None or (opts.bpe_codes is None and opts.bpe_merges)):
        raise NmtError("without --trainpref, give --srcdict (and --bpe-codes) of an existing data directory")
    src, tgt = opts.text.source_lang, opts.text.target_lang
    if src == tgt:
        raise NmtError(f"--source-lang and --target-lang are both {src!r}")
    splits = ([("train", opts.trainpref)] if opts.trainpref else []) + \
        ([("valid", opts.validpref)] if opts.validpref else []) + \
        [(f"test{i or ''}", p) for i, p in enumerate(opts.testprefs)]
    inputs = {name: (input_path(p, src), input_path(p, tgt)) for name, p in splits}
    destdir = opts.destdir.resolve()
    given = [p for pair in inputs.values() for p in pair]
    given += [p for p in (opts.bpe_codes, opts.srcdict, opts.tgtdict) if p is not None]
    check_destdir(destdir, opts.force, given)
    try:
        destdir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"{destdir.parent}: cannot create the directory ({reason(e)})") from None
    with DirectoryLock(destdir.parent / f".{destdir.name}.nmt-lock", f"--destdir {destdir}"):
        remove_stale_temporaries(destdir.parent)
        try:
            tmp = temporary_directory(destdir)
        except OSError as e:
            raise NmtError(f"{destdir.parent}: cannot write there ({reason(e)})") from None
        try:
            meta = _run_stages(opts, inputs, tmp)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            check_destdir(destdir, opts.force, given)  # again: another program may have written there meanwhile
            publish_directory(tmp, destdir)
            return meta
        except OSError as e:
            raise NmtError(f"{destdir}: cannot write the data directory ({reason(e)}); nothing was "
                           "written") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _run_stages(opts: PreprocessOptions, inputs: dict[str, tuple[Path, Path]], tmp: Path) -> dict[str, Any]:
    src, tgt = opts.text.source_lang, opts.text.target_lang
    stats = {name: SplitStats() for name in inputs}
    timings: dict[str, float] = {}
    word_counts: tuple[Counter, Counter] | None = None
    train_ranges: list[LineRange] = []
    if "train" in inputs:
        start = time.perf_counter()
        src_words, tgt_words, train_ranges = tokenize_train(opts, *inputs["train"], tmp, stats["train"])
        word_counts = (src_words, tgt_words)
        timings["tokenize_train"] = time.perf_counter() - start
        check_training_left(stats, inputs)

    start = time.perf_counter()
    if opts.bpe_codes is not None:
        text = Path(opts.bpe_codes).read_text(encoding="utf-8")
        codes: str | None = check_codes(text, f"{opts.bpe_codes}: BPE codes")  # names the file in errors
    elif opts.bpe_merges > 0:
        assert word_counts is not None
        codes = learn_bpe(word_counts[0] + word_counts[1], opts.bpe_merges, progress=show_progress(opts))
    else:
        codes = None
    timings["learn_bpe"] = time.perf_counter() - start

    start = time.perf_counter()
    segmenter = TextProcessor(opts.text, src, codes)  # joint BPE: one segmenter for both sides
    counts = word_counts
    if codes is not None and word_counts is not None:
        counts = count_subwords(opts, segmenter, word_counts)
    src_vocab, tgt_vocab = build_vocabularies(opts, counts)
    timings["vocabulary"] = time.perf_counter() - start

    dtype = token_dtype(max(len(src_vocab), len(tgt_vocab)))
    vocabs = (src_vocab.tokens[len(SPECIALS):], tgt_vocab.tokens[len(SPECIALS):])
    with Workers(opts.workers, text=opts.text, src_vocab=vocabs[0], tgt_vocab=vocabs[1], dtype=dtype,
                 segmenter=segmenter) as workers:
        for name, (src_path, tgt_path) in inputs.items():
            start = time.perf_counter()
            training = name == "train"
            if training:  # tokenized and filtered in stage 1; only --max-len in BPE tokens is left to check
                items: Iterable[Any] = train_ranges
                encode: Callable[[Any], Packed] = functools.partial(_binarize_range, max_len=opts.max_len)
            else:  # raw, and never filtered
                items = chunks(read_pairs(src_path, tgt_path), CHUNK_LINES)
                encode = functools.partial(_binarize_chunk, tokenize=True, max_len=None)
            binarize(items, encode, workers, tmp / name, dtype, stats[name], f"binarize {name}", training, opts)
            if name == "valid" and stats[name].pairs_out == 0:
                raise NmtError(f"{src_path}: the valid split is empty; training could not validate on it")
            if training:
                for lang in (src, tgt):
                    (tmp / f"train.tok.{lang}").unlink()
                check_training_left(stats, inputs)
            stats[name].seconds = time.perf_counter() - start
            timings[f"binarize_{name}"] = stats[name].seconds

    if codes is not None:
        (tmp / "bpe.codes").write_text(codes, encoding="utf-8")
    src_vocab.save(tmp / f"dict.{src}.txt")
    tgt_vocab.save(tmp / f"dict.{tgt}.txt")
    return {
        "format_version": FORMAT_VERSION,
        "nmt_cli_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "text": opts.text.to_dict(),
        "bpe_codes": "bpe.codes" if codes is not None else None,
        "bpe_merges": opts.bpe_merges if opts.bpe_codes is None else None,
        "joined_dictionary": src_vocab == tgt_vocab,
        "dictionaries": {src: f"dict.{src}.txt", tgt: f"dict.{tgt}.txt"},
        "vocab_sizes": {src: len(src_vocab), tgt: len(tgt_vocab)},
        "dtype": dtype.name,
        "filter": {"max_len": opts.max_len, "max_len_ratio": opts.max_len_ratio},
        "splits": {name: s.to_dict(src, tgt) for name, s in stats.items()},
        "inputs": {name: [str(p) for p in paths] for name, paths in inputs.items()},
        "versions": {name: version(name) for name in ("sacremoses", "subword-nmt", "numpy")},
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "checksums": {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file() and p.name != MARKER},
    }


def count_subwords(opts: PreprocessOptions, segmenter: TextProcessor,
                   word_counts: tuple[Counter, Counter]) -> tuple[Counter, Counter]:
    """Stage 3's BPE in the workers: each distinct training word is segmented once. Returns the
    subword counts of both sides, and fills `segmenter`'s cache (stage 4's workers inherit it)."""
    words = list((word_counts[0] | word_counts[1]).keys())
    totals: tuple[Counter, Counter] = (Counter(), Counter())
    with Workers(opts.workers, text=opts.text, segmenter=segmenter, word_counts=word_counts) as workers:
        for segmentations, *counts in workers.map(_segment_words, chunks(words, CHUNK_WORDS)):
            segmenter.adopt(segmentations)
            for total, chunk_counts in zip(totals, counts):
                total.update(chunk_counts)
    return totals


def build_vocabularies(opts: PreprocessOptions,
                       counts: tuple[Counter, Counter] | None) -> tuple[Vocabulary, Vocabulary]:
    """Stage 3: given dictionaries, or ones built from the training (subword) counts."""
    if opts.srcdict is not None:
        src_vocab = Vocabulary.load(opts.srcdict)
        tgt_vocab = Vocabulary.load(opts.tgtdict) if opts.tgtdict else src_vocab
        return src_vocab, tgt_vocab
    assert counts is not None
    src_counts, tgt_counts = counts
    limits = {"min_count": opts.vocab_min_count, "max_size": opts.vocab_size, "padding_factor": opts.padding_factor}
    if opts.joined_dictionary:
        vocab = Vocabulary.build(src_counts + tgt_counts, **limits)
        return vocab, vocab
    return Vocabulary.build(src_counts, **limits), Vocabulary.build(tgt_counts, **limits)
