"""Moses punctuation normalization, tokenization and detokenization: sacremoses, with two of its
slow spots made fast (same results: tests/text/test_moses.py). Imported only by a text pipeline that
uses Moses: sacremoses takes tenths of a second to import."""

from __future__ import annotations

import re
from typing import Any

import sacremoses
from sacremoses import MosesDetokenizer

__all__ = ["MosesDetokenizer", "MosesPunctNormalizer", "MosesTokenizer"]


class MosesTokenizer(sacremoses.MosesTokenizer):
    """sacremoses' tokenizer, with its two character-class tests made cheap: sacremoses builds a
    set of every lowercase (or alphabetic) Unicode character at each call, once per token that
    ends in a period inside a line. That halved tokenization speed on lines with a period inside
    (abbreviations, several sentences). Same results, as sets built once."""

    LOWER = frozenset(sacremoses.MosesTokenizer.IsLower)
    ALPHA = frozenset(sacremoses.MosesTokenizer.IsAlpha)

    def islower(self, text: str) -> bool:
        return set(text) <= self.LOWER

    def isanyalpha(self, text: str) -> bool:
        return not self.ALPHA.isdisjoint(text)


class MosesPunctNormalizer(sacremoses.MosesPunctNormalizer):
    """sacremoses' punctuation normalizer, with its substitutions prepared once: sacremoses hands
    each of its 45-46 patterns to re.sub for every line. Here each is compiled once, or, when
    pattern and replacement are plain text, applied with str.replace. The same substitutions in the
    same order, the same results (tests/text/test_moses.py compares; the tokenization stage of
    tests/benchmarks/preprocess_speed.py measures the time)."""

    REGEX_SYNTAX = frozenset(".^$*+?{}[]|()\\")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = [(pattern, None if self.is_plain(pattern, replacement) else re.compile(pattern), replacement)
                      for pattern, replacement in self.substitutions]

    @classmethod
    def is_plain(cls, pattern: str, replacement: str) -> bool:
        return bool(pattern) and cls.REGEX_SYNTAX.isdisjoint(pattern) and "\\" not in replacement

    def normalize(self, text: str) -> str:
        if self.pre_replace_unicode_punct:
            text = self.replace_unicode_punct(text)
        for pattern, compiled, replacement in self.steps:
            text = text.replace(pattern, replacement) if compiled is None else compiled.sub(replacement, text)
        if self.post_remove_control_chars:
            text = self.remove_control_chars(text)
        return text.strip()
