"""SentencePiece (Kudo and Richardson, 2018), the second subword backend beside Moses + BPE
(`nmt preprocess --subword sentencepiece`): one model for both languages, trained on the raw
training text, that turns a line into pieces and pieces back into the line. Its special ids are
ours (<pad> 0, <s> 1, </s> 2, <unk> 3), and the model travels in the data directory and in every
checkpoint, so `nmt translate` needs nothing else."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator

from nmt_cli.errors import NmtError
from nmt_cli.text.vocab import SPECIALS

MODEL_TYPES = ("unigram", "bpe")
MAX_SENTENCES = 2_000_000  # a sample of a larger corpus is enough to learn the pieces
TRAINER_THREADS = 16  # SentencePiece's default; fixed, since the scores it learns depend on it


def learn_sentencepiece(lines: Iterable[str], vocab_size: int, model_type: str,
                        source: str = "the training text") -> bytes:
    """A serialized SentencePiece model of at most `vocab_size` pieces learned from `lines`
    (`source` names them in errors), the same on any machine and for any number of workers. An
    error reading `lines` is raised as it is, not inside SentencePiece's own message."""
    import sentencepiece

    model = io.BytesIO()
    failures: list[Exception] = []

    def sentences() -> Iterator[str]:
        try:
            yield from lines
        except Exception as e:  # noqa: BLE001 (raised again below, outside the library)
            failures.append(e)

    pad, bos, eos, unk = SPECIALS
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece=pad, bos_piece=bos, eos_piece=eos, unk_piece=unk,
            character_coverage=1.0, hard_vocab_limit=False, input_sentence_size=MAX_SENTENCES,
            shuffle_input_sentence=True, num_threads=TRAINER_THREADS, minloglevel=2)
    except RuntimeError as e:
        if failures:
            raise failures[0] from None
        raise NmtError(_training_error(str(e), vocab_size, source)) from None
    if failures:
        raise failures[0]
    return model.getvalue()


def _training_error(message: str, vocab_size: int, source: str) -> str:
    """SentencePiece's error in our words: what is wrong and which of our options mends it."""
    if "sentences_.empty()" in message:
        return f"{source}: no sentence to learn a SentencePiece model from"
    needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
    if needed:
        return (f"--vocab-size {vocab_size} is too small for {source}: each of its characters needs a piece, "
                f"so SentencePiece needs at least {needed.group(1)}")
    last = re.sub(r"^.*?\] ", "", (message.strip().splitlines() or ["unknown error"])[-1])  # no source lines
    return f"SentencePiece could not learn a model from {source}: {last}"


def load_sentencepiece(model: bytes, source: str = "SentencePiece model", specials: bool = True) -> object:
    """A SentencePieceProcessor of a serialized model; with `specials`, one whose special pieces
    have our ids (a vocabulary is to be built from its pieces)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model)
    except (RuntimeError, TypeError, OSError):
        raise NmtError(f"{source}: not a SentencePiece model (its protobuf does not parse)") from None
    if not specials:
        return processor
    ids = [processor.piece_to_id(piece) for piece in SPECIALS]
    if ids != list(range(len(SPECIALS))):
        raise NmtError(f"{source}: its special pieces {', '.join(SPECIALS)} have ids {ids}, not 0-3 "
                       "(train it with pad_id=0 bos_id=1 eos_id=2 unk_id=3, or let `nmt preprocess` train it)")
    return processor
