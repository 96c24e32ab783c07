"""One model's way between text and token ids, in one place: a source line (raw text, or BPE
tokens with input format `bpe`) to source ids, a target prefix or reference to target ids, each
cut to the model's positions with a warning that names the line, and output ids back to text
(detokenized), to tokens (BPE joined) or to BPE as produced."""

from __future__ import annotations

import functools
from collections.abc import Callable

from nmt_cli.model.checkpoint import ModelBundle
from nmt_cli.text.processor import BPE_SEPARATOR, TextProcessor
from nmt_cli.text.vocab import EOS_ID, UNK, UNK_ID

INPUT_FORMATS = ("raw", "bpe")
OUTPUT_FORMATS = ("text", "tokens", "bpe")


def joining_ids(bundle: ModelBundle) -> list[int]:
    """The target ids that go on into the next token's word: BPE's `@@` tokens (SentencePiece
    marks where a word begins on its first piece instead)."""
    if bundle.pieces("target") is not None:
        return []
    return [i for i, token in enumerate(bundle.tgt_vocab.tokens) if token.endswith(BPE_SEPARATOR)]


class TextPipeline:
    """`bundle`'s text settings, subword model and vocabularies, for a model of `max_positions`."""

    def __init__(self, bundle: ModelBundle, max_positions: int, input_format: str = "raw",
                 output_format: str = "text", warn: Callable[[str], None] = print) -> None:
        self.bundle, self.max_positions, self.warn = bundle, max_positions, warn
        self.input_format, self.output_format = input_format, output_format
        self.src_vocab, self.tgt_vocab = bundle.src_vocab, bundle.tgt_vocab
        text, codes = bundle.text, bundle.bpe_codes if input_format == "raw" else None
        self.source = TextProcessor(text, text.source_lang, codes, bundle.pieces("source"))
        self.target = TextProcessor(text, text.target_lang, None, bundle.pieces("target"))  # detokenizes
        self.unknown_target = False  # a prefix or reference held tokens the vocabulary lacks (warned once)
        self.codes = set(bundle.language_codes)  # a multilingual model's target-language tokens
        self.uncoded = False  # a line came without one (warned once)
        self.alone = False  # an empty source came with a prefix (warned once)
        self.unknown_phrase = False  # a constraint held a token the vocabulary lacks (warned once)

    @functools.cached_property
    def target_encoder(self) -> TextProcessor:
        """The target side's way in (prefixes, references): made when first needed, as BPE codes
        take a while to read."""
        text = self.bundle.text
        codes = self.bundle.bpe_codes if self.input_format == "raw" else None
        return TextProcessor(text, text.target_lang, codes, self.bundle.pieces("target"))

    def source_ids(self, line: str, number: int) -> list[int]:
        """The source ids of a line (none for a blank one), at most the model's positions less EOS."""
        if not line.strip():
            return []
        tokens = self.source.encode(line) if self.input_format == "raw" else line.split()
        if self.codes and not self.uncoded and tokens[0] not in self.codes:
            examples = " or ".join(sorted(self.codes)[:2])
            self.warn(f"warning: line {number}: this multilingual model expects a target-language code such as "
                      f"{examples} at the start of each line (`nmt info -m` lists its {len(self.codes)}); "
                      "translating without (warned once)")
            self.uncoded = True
        return self._cut(self.src_vocab.encode(tokens), self.max_positions - 1, number, "tokens", "translating")

    def target_ids(self, line: str, number: int, what: str = "prefix") -> list[int]:
        """The target ids of a `prefix` (room left for EOS and a token) or a `reference` (for EOS)."""
        if not line.strip():
            return []
        tokens = self._target_tokens(line)
        ids = self.tgt_vocab.encode(tokens)
        if not self.unknown_target and UNK_ID in ids:
            unknown = [t for t, i in zip(tokens, ids) if i == UNK_ID and t != UNK]
            if unknown:
                forced = "forced" if what == "prefix" else "scored"
                self.warn(f"warning: line {number}: the {what} has {', '.join(map(repr, unknown[:3]))}, which the "
                          f"model's vocabulary lacks: {forced} as <unk> (warned once)")
                self.unknown_target = True
        limit = self.max_positions - (2 if what == "prefix" else 1)
        return self._cut(ids, limit, number, f"{what} tokens", "keeping" if what == "prefix" else "scoring")

    def phrase_ids(self, phrases: list[str], number: int) -> list[list[int]]:
        """The target ids of a line's constraint phrases, segmented as in running text; a blank one
        is none, and one that reads as <unk> is dropped (warned once, naming the line)."""
        found = []
        for phrase in phrases:
            ids = self.tgt_vocab.encode(self._target_tokens(phrase))
            if UNK_ID in ids:
                if not self.unknown_phrase:
                    self.warn(f"warning: line {number}: the phrase {phrase!r} has a token the model's vocabulary "
                              "lacks: left out (warned once)")
                    self.unknown_phrase = True
            elif ids:
                found.append(ids)
        return found

    def _target_tokens(self, text: str) -> list[str]:
        """A target-side text (prefix, reference, phrase) as the model's tokens, as in running text."""
        return self.target_encoder.encode(text) if self.input_format == "raw" else text.split()

    def prefix_alone(self, prefix: list[int], number: int) -> list[int]:
        """The output of an empty source with a prefix (its target ids): the prefix alone, nothing
        being left to translate (warned once, naming the line)."""
        if not self.alone:
            self.warn(f"warning: line {number}: an empty source with a prefix: its output is the prefix alone "
                      "(warned once)")
            self.alone = True
        return prefix

    def _cut(self, ids: list[int], limit: int, number: int, what: str, doing: str) -> list[int]:
        if len(ids) > limit:
            self.warn(f"warning: line {number}: {len(ids)} {what}, more than the model's {limit}; {doing} the "
                      f"first {limit}")
            return ids[:limit]
        return ids

    def text(self, ids: list[int]) -> str:
        """Output ids in the output format: detokenized text, tokens (BPE joined) or BPE."""
        if self.output_format == "text":
            return self.detokenized(ids)
        tokens = self.tgt_vocab.decode(ids)
        if self.output_format == "tokens":
            return " ".join(self.target.join_subwords(tokens))
        return " ".join(tokens)

    def detokenized(self, ids: list[int]) -> str:
        """Output ids as detokenized text, whatever the output format (what sacreBLEU scores)."""
        return self.target.decode(self.tgt_vocab.decode(ids))

    def tokens(self, ids: list[int]) -> list[str]:
        """The subword tokens of target ids."""
        return self.tgt_vocab.decode(ids)

    def labels(self, source: list[int], output: list[int]) -> tuple[list[str], list[str]]:
        """Axis labels of attention: source and output subwords, each ending in </s>."""
        return self.src_vocab.decode(source + [EOS_ID]), self.tgt_vocab.decode(output + [EOS_ID])
