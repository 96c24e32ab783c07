"""The worker processes of `nmt preprocess` and their shared state."""

from collections import Counter

from conftest import head

from nmt_cli.bpe import learn_bpe
from nmt_cli.config import TextConfig
from nmt_cli.text import TextProcessor
from nmt_cli.vocab import UNK_ID, Vocabulary
from nmt_cli.workers import WordIds, Workers


def test_word_ids_equal_segmenting_the_whole_line(multi30k):
    config = TextConfig("en", "de")
    plain = TextProcessor(config, "de")
    lines = [plain.tokenize(line) for line in head(multi30k / "train.de", 300)]
    codes = learn_bpe(Counter(w for words in lines[:150] for w in words), 200)
    processor = TextProcessor(config, "de", codes)
    vocab = Vocabulary.build(Counter(t for words in lines[:150] for t in processor.segment(words)))
    word_ids = WordIds(processor, vocab)
    for words in lines + [[], ["", "Hund"]]:  # the second half has unseen words, hence unknown subwords
        assert word_ids.encode(words) == vocab.encode(processor.segment(words))
    assert UNK_ID in word_ids.encode([w for words in lines[150:] for w in words])


def _frozen_objects(_: object) -> int:
    import gc

    return gc.get_freeze_count()


def test_workers_garbage_collector_leaves_inherited_objects_alone():
    import gc

    inherited = [[i] for i in range(10_000)]  # objects the collector tracks, made before the fork
    with Workers(2, text=TextConfig("en", "de")) as workers:
        counts = list(workers.map(_frozen_objects, range(4)))
    assert min(counts) >= len(inherited)  # frozen in the workers: their collections skip them
    assert gc.get_freeze_count() == 0  # and collected as usual here
