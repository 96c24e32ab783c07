"""The worker processes of `nmt preprocess` and their shared state."""

from collections import Counter

from conftest import head

from nmt_cli.config import TextConfig
from nmt_cli.corpus.workers import WordIds, Workers
from nmt_cli.text.bpe import learn_bpe
from nmt_cli.text.processor import TextProcessor
from nmt_cli.text.vocab import UNK_ID, Vocabulary


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


def _big(_: object) -> bytes:
    return bytes(32 << 20)  # a worker takes a while to send it through the results pipe


def test_a_stage_stopped_midway_ends_its_workers_only_once_no_result_is_in_flight(monkeypatch):
    """A worker killed while it sends a result leaves half a message in the pool's results pipe,
    and Pool.terminate() then waits forever (an interrupted `nmt preprocess` hung): every result
    asked for is complete when the workers are ended, and ending them returns."""
    ready_at_terminate = []
    with Workers(2, text=TextConfig("en", "de")) as workers:
        terminate = workers.pool.terminate
        monkeypatch.setattr(workers.pool, "terminate",
                            lambda: ready_at_terminate.extend(r.ready() for r in workers.pending) or terminate())
        try:
            for _ in workers.map(_big, range(40)):
                raise KeyboardInterrupt  # as Ctrl-C in the middle of a stage
        except KeyboardInterrupt:
            pass
    assert len(ready_at_terminate) == 4 * 2 - 1 and all(ready_at_terminate)
