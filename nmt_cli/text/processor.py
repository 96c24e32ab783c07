"""Text in and out of the model: Moses normalization and tokenization (moses.py), joint BPE
(learned by bpe.py with subword-nmt's result, applied by subword-nmt) or SentencePiece
(pieces.py), and the way back (BPE removal, detokenization).

The settings (`TextConfig`) and the BPE codes are written into the data directory and into every
checkpoint, so that `nmt translate` applies exactly what training saw.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Mapping

from subword_nmt.apply_bpe import BPE

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.text.pieces import load_sentencepiece

BPE_SEPARATOR = "@@"


class TextProcessor:
    """One language's way from a raw line to subword tokens and back."""

    def __init__(self, config: TextConfig, lang: str, bpe_codes: str | None = None,
                 sentencepiece: bytes | None = None) -> None:
        self.config, self.lang = config, lang
        if config.sentencepiece and sentencepiece is None:
            raise ValueError("TextConfig(subword='sentencepiece') needs its SentencePiece model")
        self.pieces = load_sentencepiece(sentencepiece, specials=False) if config.sentencepiece else None
        self.normalizer = self.tokenizer = self.detokenizer = None
        if config.tokenizer == "moses" and not config.sentencepiece:
            from nmt_cli.text import moses  # sacremoses takes tenths of a second to import: only when used

            self.normalizer = moses.MosesPunctNormalizer(lang=lang) if config.normalize_punctuation else None
            self.tokenizer = moses.MosesTokenizer(lang=lang)
            self.detokenizer = moses.MosesDetokenizer(lang=lang)
        self.protected = config.protected or None
        self.whole = re.compile("|".join(f"(?:{p})" for p in config.protected)) if config.protected else None
        self.bpe = BPE(io.StringIO(check_codes(bpe_codes)), separator=BPE_SEPARATOR,
                       glossaries=self.protected) if bpe_codes else None

    def tokenize(self, line: str) -> list[str]:
        """Raw line -> words: punctuation normalization, Moses tokenization, lowercasing; the
        protected words (tags, --protect) pass whole. With SentencePiece: the line's pieces."""
        if self.pieces is not None:
            code, line = split_language_code(line) if self.config.language_codes else ([], line)
            return code + self.pieces.encode(line.lower() if self.config.lowercase else line, out_type=str)
        if self.normalizer is not None:
            line = self.normalizer.normalize(line)
        if self.tokenizer is not None:
            words = self.tokenizer.tokenize(line, escape=self.config.escape, protected_patterns=self.protected,
                                            aggressive_dash_splits=self.config.aggressive_dash_splits)
        else:
            words = line.split()
        if not self.config.lowercase:
            return words
        return [w if self.whole is not None and self.whole.fullmatch(w) else w.lower() for w in words]

    def segment(self, words: list[str]) -> list[str]:
        """Words -> BPE subwords ("@@" marks a subword that continues)."""
        return self.bpe.segment_tokens(words) if self.bpe is not None else words

    def encode(self, line: str) -> list[str]:
        return self.segment(self.tokenize(line))

    def segmentations(self, words: list[str]) -> dict[str, tuple[str, ...]]:
        """Segment `words` and return subword-nmt's cache entries for them, which a processor
        with the same codes can `adopt` (one-character words are not cached: nothing to do)."""
        assert self.bpe is not None
        self.bpe.segment_tokens(words)
        return {word: self.bpe.cache[word] for word in words if word in self.bpe.cache}

    def adopt(self, segmentations: dict[str, tuple[str, ...]]) -> None:
        """Take segmentations made elsewhere (`segmentations` of a worker) into this BPE's cache."""
        assert self.bpe is not None
        self.bpe.cache.update(segmentations)

    def sample(self, pieces: list[str], alpha: float) -> list[str]:
        """The text of `pieces` segmented again, sampled from the SentencePiece model's
        segmentations (subword regularization; `alpha` smooths their distribution)."""
        assert self.pieces is not None
        return self.pieces.encode(self.pieces.decode_pieces(pieces), out_type=str, enable_sampling=True, alpha=alpha,
                                  nbest_size=-1)

    @staticmethod
    def join_subwords(tokens: list[str]) -> list[str]:
        """Subword tokens -> words: a token ending in "@@" joined to the next."""
        return " ".join(tokens).replace(BPE_SEPARATOR + " ", "").removesuffix(BPE_SEPARATOR).split()

    def decode(self, tokens: list[str]) -> str:
        """Subword tokens -> text: BPE joined back, then Moses detokenization (or SentencePiece's own,
        with a space for the word boundary of a piece it lacks (a release's shared vocabulary holds
        the other side's pieces) and none at either end, as MarianTokenizer does)."""
        if self.pieces is not None:
            return self.pieces.decode_pieces(tokens).replace("\u2581", " ").strip()
        words = self.join_subwords(tokens)
        return self.detokenizer.detokenize(words) if self.detokenizer is not None else " ".join(words)


def split_language_code(line: str) -> tuple[list[str], str]:
    """A leading >>code<< (a multilingual Marian model's target language) and the rest of the line,
    as MarianTokenizer splits them."""
    end = line.find("<<") if line.startswith(">>") else -1
    return ([line[: end + 2]], line[end + 2:]) if end != -1 else ([], line)


def check_codes(codes: str, source: str = "BPE codes") -> str:
    """BPE codes as subword-nmt writes them: an optional '#version' line, then one 'a b' merge a line."""
    lines = codes.rstrip("\n").split("\n")
    first = 1 if lines and lines[0].startswith("#version") else 0
    if len(lines) <= first:
        raise NmtError(f"{source}: no merge operations")
    for number, line in enumerate(lines[first:], start=first + 1):
        if len(line.strip("\r ").split(" ")) != 2:
            raise NmtError(f"{source}:{number}: expected a merge 'a b', got {line[:60]!r}")
    if not first and all(line.strip("\r ").split(" ")[1].isdecimal() for line in lines):
        raise NmtError(f"{source}: every line a token and a count: a vocabulary or dictionary (fairseq's dict.txt?), "
                       "not BPE merges")
    return codes


def subword_counts(processor: TextProcessor, word_counts: Mapping[str, int]) -> Counter[str]:
    """Counts of BPE subwords, from word counts: each distinct word is segmented once."""
    counts: Counter[str] = Counter()
    for word, count in word_counts.items():
        for subword in processor.segment([word]):
            counts[subword] += count
    return counts
