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
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from nmt_cli.config import PreprocessConfig
from nmt_cli.corpus.data import ArrayWriter, token_dtype
from nmt_cli.corpus.datadir import FORMAT_VERSION, DataDir
from nmt_cli.corpus.report import bar, show_progress
from nmt_cli.corpus.workers import (
    LineRange,
    Packed,
    Workers,
    binarize_chunk,
    binarize_range,
    sample_range,
    segment_words,
    tokenize_chunk,
)
from nmt_cli.errors import NmtError
from nmt_cli.files import DirectoryLock, reason, write_directory
from nmt_cli.lines import chunks, input_path, line_count, read_pairs
from nmt_cli.text.bpe import learn_bpe
from nmt_cli.text.pieces import learn_sentencepiece, load_sentencepiece
from nmt_cli.text.processor import TextProcessor, check_codes
from nmt_cli.text.vocab import SPECIALS, Vocabulary
from nmt_cli.version import __version__

CHUNK_LINES = 250  # small enough that a 1,000-line test set still keeps every worker busy
# The training split's chunks are larger: each chunk costs the parent CPU time in its pool's
# threads (sending, receiving), and the one parent feeds every worker (preprocess_speed.py).
TRAIN_CHUNK_LINES = 1000
CHUNK_WORDS = 2000


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


def check_training_left(stats: dict[str, SplitStats], inputs: dict[str, tuple[Path, Path]]) -> None:
    """An empty training set after filtering is an error, not a model trained on nothing."""
    train = stats.get("train")
    if train is not None and train.pairs_in - sum(train.dropped.values()) <= 0:
        raise NmtError(f"{inputs['train'][0]}: no training pair is left after filtering "
                       f"({train.pairs_in} read, dropped: {dict(train.dropped) or 'none'})")


def tokenize_train(opts: PreprocessConfig, src_path: Path, tgt_path: Path, work: Path, stats: SplitStats,
                   pieces: dict[str, bytes | None]) -> tuple[Counter, Counter, list[LineRange]]:
    """Stage 1: tokenized, filtered training pairs to `work/train.tok.*`; returns word counts and
    where each chunk of lines starts in the two files (so stage 4's workers read them directly)."""
    src_words: Counter = Counter()
    tgt_words: Counter = Counter()
    ranges: list[LineRange] = []
    src_tok, tgt_tok = (work / f"train.tok.{lang}" for lang in (opts.text.source_lang, opts.text.target_lang))
    tokenize = functools.partial(tokenize_chunk, max_len=opts.max_len, max_ratio=opts.max_len_ratio)
    with open(src_tok, "wb") as fs, open(tgt_tok, "wb") as ft, \
            Workers(opts.workers, text=opts.text, **pieces) as workers, \
            bar(opts, "tokenize train", lambda: line_count(src_path)) as progress:
        for chunk in workers.map(tokenize, chunks(read_pairs(src_path, tgt_path), TRAIN_CHUNK_LINES)):
            progress.update(chunk.kept + chunk.dropped.total())
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
             dtype: np.dtype, stats: SplitStats, progress: tqdm, training: bool, opts: PreprocessConfig) -> None:
    """Stage 4 for one split: `encode` each item in the workers, append the ids to
    `prefix.{src,tgt}.bin/.idx` in order. Training pairs were counted in stage 1."""
    src, tgt = opts.text.source_lang, opts.text.target_lang
    writers = {src: ArrayWriter(Path(f"{prefix}.{src}"), dtype), tgt: ArrayWriter(Path(f"{prefix}.{tgt}"), dtype)}
    try:
        for packed in workers.map(encode, items):
            kept = len(packed.lengths[0])
            progress.update(kept + packed.too_long)
            stats.pairs_in += 0 if training else kept
            stats.pairs_out += kept
            if packed.too_long:
                stats.dropped["too_long"] += packed.too_long
            for lang, ids, lengths, unknown in zip((src, tgt), packed.ids, packed.lengths, packed.unknown):
                writers[lang].extend(ids, lengths)
                stats.tokens[lang] += len(ids)
                stats.unknown[lang] += unknown
    finally:
        progress.close()
        for writer in writers.values():
            writer.close()


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
    ours = DataDir.files_of(destdir)
    if ours is None:
        raise NmtError(f"{destdir}: --force replaces only a directory made by `nmt preprocess`, and this one "
                       "has no readable meta.json; remove it yourself or choose another --destdir")
    foreign = sorted(p.name for p in destdir.iterdir() if p.name not in ours)
    if foreign:
        raise NmtError(f"{destdir}: --force would delete {', '.join(foreign[:3])}"
                       f"{' and more' if len(foreign) > 3 else ''}, which nmt did not write; move them first")


def check_options(opts: PreprocessConfig) -> None:
    """Refuse a combination of options that cannot make a data directory, naming the flags."""
    sentencepiece = opts.text.sentencepiece
    if opts.trainpref is None and (opts.srcdict is None or (
            opts.sentencepiece_model is None if sentencepiece else opts.bpe_codes is None and opts.bpe_merges)):
        model = "--sentencepiece-model" if sentencepiece else "--bpe-codes"
        raise NmtError(f"without --trainpref, give --srcdict (and {model}) of an existing data directory")
    if opts.text.source_lang == opts.text.target_lang:
        raise NmtError(f"--source-lang and --target-lang are both {opts.text.source_lang!r}")
    if sentencepiece and opts.sentencepiece_model is None and opts.vocab_size is None:
        raise NmtError("--subword sentencepiece needs --vocab-size N: the pieces of the model it learns")
    if opts.sentencepiece_samples and opts.trainpref is None:
        raise NmtError("--sentencepiece-samples samples the training split: give --trainpref")


def preprocess(opts: PreprocessConfig) -> DataDir:
    """Run every stage; returns the data directory written."""
    check_options(opts)
    src, tgt = opts.text.source_lang, opts.text.target_lang
    splits = ([("train", opts.trainpref)] if opts.trainpref else []) + \
        ([("valid", opts.validpref)] if opts.validpref else []) + \
        [(f"test{i or ''}", p) for i, p in enumerate(opts.testprefs)]
    inputs = {name: (input_path(p, src), input_path(p, tgt)) for name, p in splits}
    destdir = opts.destdir.resolve()
    given = [p for pair in inputs.values() for p in pair]
    given += [p for p in (opts.bpe_codes, opts.sentencepiece_model, opts.srcdict, opts.tgtdict) if p is not None]
    check_destdir(destdir, opts.force, given)
    try:
        destdir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"{destdir.parent}: cannot write there ({reason(e)})") from None
    with DirectoryLock(destdir.parent / f".{destdir.name}.nmt-lock", f"--destdir {destdir}"):
        meta = write_directory(destdir, "data directory", lambda tmp: DataDir.write(tmp, _run_stages(
            opts, inputs, tmp)).meta, lambda: check_destdir(destdir, opts.force, given))
    return DataDir(destdir, meta)


def _run_stages(opts: PreprocessConfig, inputs: dict[str, tuple[Path, Path]], tmp: Path) -> dict[str, Any]:
    """Stages 1-4 into `tmp`; returns meta.json's description of the result (checksums aside)."""
    src, tgt = opts.text.source_lang, opts.text.target_lang
    stats = {name: SplitStats() for name in inputs}
    timings: dict[str, float] = {}
    start = time.perf_counter()
    pieces = sentencepiece_models(opts, inputs.get("train"))
    timings["learn_sentencepiece"] = time.perf_counter() - start
    word_counts, train_ranges = first_stage(opts, inputs, tmp, stats, timings, pieces)

    start = time.perf_counter()
    codes = bpe_codes(opts, word_counts)
    timings["learn_bpe"] = time.perf_counter() - start

    start = time.perf_counter()
    segmenter = TextProcessor(opts.text, src, codes, pieces["sentencepiece"])  # joint BPE: one for both sides
    counts = word_counts
    if codes is not None and word_counts is not None:
        counts = count_subwords(opts, segmenter, word_counts)
    src_vocab, tgt_vocab = build_vocabularies(opts, counts)
    timings["vocabulary"] = time.perf_counter() - start

    dtype = token_dtype(max(len(src_vocab), len(tgt_vocab)))
    vocabs = (src_vocab.tokens[len(SPECIALS):], tgt_vocab.tokens[len(SPECIALS):])
    with Workers(opts.workers, text=opts.text, src_vocab=vocabs[0], tgt_vocab=vocabs[1], dtype=dtype,
                 segmenter=segmenter, **pieces) as workers:
        for name in inputs:
            binarize_split(name, opts, inputs, train_ranges, workers, tmp, dtype, stats)
            timings[f"binarize_{name}"] = stats[name].seconds
        sample_segmentations(opts, train_ranges, workers, tmp, dtype, stats)
    for lang in (src, tgt) if train_ranges else ():
        (tmp / f"train.tok.{lang}").unlink()

    if codes is not None:
        (tmp / "bpe.codes").write_text(codes, encoding="utf-8")
    for key, name in SENTENCEPIECE_FILES.items():
        if pieces[key] is not None:
            (tmp / name).write_bytes(pieces[key])
    src_vocab.save(tmp / f"dict.{src}.txt")
    tgt_vocab.save(tmp / f"dict.{tgt}.txt")
    return {
        "format_version": FORMAT_VERSION,
        "nmt_cli_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "text": opts.text.to_dict(),
        "bpe_codes": "bpe.codes" if codes is not None else None,
        "bpe_merges": opts.bpe_merges if codes is not None and opts.bpe_codes is None else None,
        **{key: name if pieces[key] is not None else None for key, name in SENTENCEPIECE_FILES.items()},
        "joined_dictionary": src_vocab == tgt_vocab,
        "dictionaries": {src: f"dict.{src}.txt", tgt: f"dict.{tgt}.txt"},
        "vocab_sizes": {src: len(src_vocab), tgt: len(tgt_vocab)},
        "dtype": dtype.name,
        "filter": {"max_len": opts.max_len, "max_len_ratio": opts.max_len_ratio},
        "splits": {name: s.to_dict(src, tgt) for name, s in stats.items()},
        "inputs": {name: [str(p) for p in paths] for name, paths in inputs.items()},
        "versions": {name: version(name) for name in (
            ("sentencepiece",) if opts.text.sentencepiece else ("sacremoses", "subword-nmt")) + ("numpy",)},
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def first_stage(opts: PreprocessConfig, inputs: dict[str, tuple[Path, Path]], tmp: Path,
                stats: dict[str, SplitStats], timings: dict[str, float],
                pieces: dict[str, bytes | None]) -> tuple[tuple[Counter, Counter] | None, list[LineRange]]:
    """Stage 1 when there is a training split: its word counts and where its tokenized lines are."""
    if "train" not in inputs:
        return None, []
    start = time.perf_counter()
    src_words, tgt_words, train_ranges = tokenize_train(opts, *inputs["train"], tmp, stats["train"], pieces)
    timings["tokenize_train"] = time.perf_counter() - start
    check_training_left(stats, inputs)
    return (src_words, tgt_words), train_ranges


# The SentencePiece models of a data directory: Workers' keyword and file name.
SENTENCEPIECE_FILES = {"sentencepiece": "spm.model", "target_sentencepiece": "spm.target.model"}


def sentencepiece_models(opts: PreprocessConfig, train: tuple[Path, Path] | None) -> dict[str, bytes | None]:
    """Stage 0 with --subword sentencepiece: the given model (checked, and the target side's own
    if given), or one learned from the raw training lines of both sides; None for BPE."""
    models: dict[str, bytes | None] = dict.fromkeys(SENTENCEPIECE_FILES)
    if not opts.text.sentencepiece:
        return models
    if opts.sentencepiece_model is not None:
        for key, path in (("sentencepiece", opts.sentencepiece_model),
                          ("target_sentencepiece", opts.target_sentencepiece_model)):
            if path is not None:
                models[key] = Path(path).read_bytes()  # with a given vocabulary, its special ids need not be ours
                load_sentencepiece(models[key], str(path), specials=opts.srcdict is None)
        return models
    assert train is not None and opts.vocab_size is not None  # check_options
    lines = (line.lower() if opts.text.lowercase else line
             for pair in read_pairs(*train) for line in pair if line.strip() and "\x00" not in line)
    models["sentencepiece"] = learn_sentencepiece(lines, opts.vocab_size, opts.sentencepiece_type,
                                                  f"{train[0]} and {train[1]}")
    return models


def bpe_codes(opts: PreprocessConfig, word_counts: tuple[Counter, Counter] | None) -> str | None:
    """Stage 2: the given codes (checked), codes learned from the training words, or none."""
    if opts.text.sentencepiece:
        return None
    if opts.bpe_codes is not None:
        text = Path(opts.bpe_codes).read_text(encoding="utf-8")
        return check_codes(text, f"{opts.bpe_codes}: BPE codes")  # names the file in errors
    if opts.bpe_merges > 0:
        assert word_counts is not None
        return learn_bpe(word_counts[0] + word_counts[1], opts.bpe_merges, progress=show_progress(opts))
    return None


def binarize_split(name: str, opts: PreprocessConfig, inputs: dict[str, tuple[Path, Path]],
                   train_ranges: list[LineRange], workers: Workers, tmp: Path, dtype: np.dtype,
                   stats: dict[str, SplitStats]) -> None:
    """Stage 4 for split `name`: the training split's tokenized lines (filtered in stage 1; only
    --max-len in BPE tokens is left to check), or another split's raw lines, never filtered."""
    start = time.perf_counter()
    src_path, tgt_path = inputs[name]
    training = name == "train"
    if training:
        items: Iterable[Any] = train_ranges
        encode: Callable[[Any], Packed] = functools.partial(binarize_range, max_len=opts.max_len)
        progress = bar(opts, f"binarize {name}", lambda: sum(r.lines for r in train_ranges))
    else:
        items = chunks(read_pairs(src_path, tgt_path), CHUNK_LINES)
        encode = functools.partial(binarize_chunk, tokenize=True, max_len=None)
        progress = bar(opts, f"binarize {name}", lambda: line_count(src_path))
    binarize(items, encode, workers, tmp / name, dtype, stats[name], progress, training, opts)
    if name == "valid" and stats[name].pairs_out == 0:
        raise NmtError(f"{src_path}: the valid split is empty; training could not validate on it")
    if training:
        check_training_left(stats, inputs)
    stats[name].seconds = time.perf_counter() - start


def sample_segmentations(opts: PreprocessConfig, train_ranges: list[LineRange], workers: Workers, tmp: Path,
                         dtype: np.dtype, stats: dict[str, SplitStats]) -> None:
    """Stage 5 with --sentencepiece-samples N: N more copies of the training split, each pair
    segmented anew by sampling from the SentencePiece model (subword regularization)."""
    for copy in range(opts.sentencepiece_samples):
        name, start = f"train.sample{copy}", time.perf_counter()
        stats[name] = SplitStats(pairs_in=stats["train"].pairs_out)
        encode = functools.partial(sample_range, copy=copy, alpha=opts.sentencepiece_alpha, max_len=opts.max_len)
        progress = bar(opts, f"sample {name}", lambda: sum(r.lines for r in train_ranges))
        binarize(train_ranges, encode, workers, tmp / name, dtype, stats[name], progress, True, opts)
        stats[name].seconds = time.perf_counter() - start


def count_subwords(opts: PreprocessConfig, segmenter: TextProcessor,
                   word_counts: tuple[Counter, Counter]) -> tuple[Counter, Counter]:
    """Stage 3's BPE in the workers: each distinct training word is segmented once. Returns the
    subword counts of both sides, and fills `segmenter`'s cache (stage 4's workers inherit it)."""
    words = list((word_counts[0] | word_counts[1]).keys())
    totals: tuple[Counter, Counter] = (Counter(), Counter())
    with Workers(opts.workers, text=opts.text, segmenter=segmenter, word_counts=word_counts) as workers:
        for segmentations, *counts in workers.map(segment_words, chunks(words, CHUNK_WORDS)):
            segmenter.adopt(segmentations)
            for total, chunk_counts in zip(totals, counts):
                total.update(chunk_counts)
    return totals


def build_vocabularies(opts: PreprocessConfig,
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
