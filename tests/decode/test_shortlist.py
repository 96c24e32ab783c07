"""Lexical shortlists: learned from a data directory, read back checked, and a search over them
(tests/decode/test_search.py holds the shortlisted search against the search written out)."""

import json

import numpy as np
import pytest
from builders import run_training, whole_shortlist
from conftest import NEEDS_CTRANSLATE2, cli, synthetic_data_dir

from nmt_cli import NmtError, Translator
from nmt_cli.corpus.datadir import DataDir
from nmt_cli.decode.shortlist import Shortlist, make
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

LINES = ["a b c d", "e f g", "h a b c d e f g", "c", "d d e"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A data directory of the reversal task and a tiny model trained on it for a few updates."""
    tmp = tmp_path_factory.mktemp("shortlist")
    data = synthetic_data_dir(tmp, n_train=300, n_valid=20)
    run_training(data, tmp / "ck", max_updates=30).run()
    return data, tmp / "ck/checkpoint_last.pt"


def whole(data) -> Shortlist:
    source, target = DataDir.open(data).vocabularies()
    return whole_shortlist(source.tokens, target.tokens)


def test_ibm_model_1_finds_each_words_translation(trained):
    """In the reversal task each token translates as itself: IBM model 1's best candidate of every
    source token is that token."""
    data, _ = trained
    shortlist = make(data, first=0, best=1)
    source, target = DataDir.open(data).vocabularies()
    words = [token for token in source.tokens[4:] if token in source.index]
    assert len(words) >= 10
    assert [target.tokens[shortlist.candidates[source.index[w], 0]] for w in words] == words
    frequent = make(data, first=3, best=2)
    assert len(frequent.frequent) == 3 and frequent.candidates.shape == (len(source), 2)
    assert not set(frequent.frequent.tolist()) & {PAD_ID, BOS_ID, EOS_ID, UNK_ID}


def test_a_batch_outputs_its_candidates_the_frequent_tokens_the_specials_and_what_it_must():
    shortlist = Shortlist(np.array([[-1, -1]] * 5 + [[7, 8], [9, -1], [-1, -1]]), np.array([10, 11]), "s", "t", 20)
    columns = shortlist.columns([[5, 6], [6]], extra=[15, 7]).tolist()
    assert columns == [PAD_ID, BOS_ID, EOS_ID, UNK_ID, 7, 8, 9, 10, 11, 15]


def test_the_file_reads_back_and_a_damaged_one_is_one_line(trained, tmp_path):
    data, _ = trained
    result = cli("shortlist", data, "-o", tmp_path / "s.txt", "--first", 5, "--best", 3)
    assert result.exit_code == 0, result.output
    made, back = make(data, 5, 3), Shortlist.load(tmp_path / "s.txt")
    assert (back.candidates == made.candidates).all() and (back.frequent == made.frequent).all()
    assert (back.source_digest, back.target_digest, back.target_size) == (made.source_digest, made.target_digest,
                                                                          made.target_size)
    lines = (tmp_path / "s.txt").read_text().split("\n")
    head = json.loads(lines[1])
    for text, message in [("\n".join(lines[:-4]) + "\n", r":\d+: \d+ source tokens, the header says \d+ \(a truncated"),
                          ("hello\n", ":1: not a shortlist of `nmt shortlist`"),
                          (f"{lines[0]}\n{{broken\n", ":2: a damaged shortlist header"),
                          ("\n".join(lines[:2] + [str(head["target_size"])] + lines[3:]),
                           ":3: more than 3 candidates, or an id outside the target vocabulary"),
                          ("\n".join([lines[0], json.dumps({**head, "frequent": [head["target_size"]]}), *lines[2:]]),
                           ":2: a frequent token's id outside the target vocabulary"),
                          ("\n".join([lines[0], json.dumps({**head, "frequent": [[1]]}), *lines[2:]]),
                           ":2: a frequent token's id outside the target vocabulary")]:
        (tmp_path / "bad.txt").write_text(text)
        with pytest.raises(NmtError, match=f"^{tmp_path / 'bad.txt'}{message}"):
            Shortlist.load(tmp_path / "bad.txt")
    (tmp_path / "zero.txt").symlink_to("/dev/zero")  # a device that never ends is not read
    with pytest.raises(NmtError, match=f"^{tmp_path / 'zero.txt'}: a character device, not a regular file"):
        Shortlist.load(tmp_path / "zero.txt")
    assert cli("shortlist", data, "-o", tmp_path / "x", "--first", 0, "--best", 0).exit_code == 2


def test_a_shortlist_of_the_whole_vocabulary_changes_nothing(trained, tmp_path):
    """Beam search, n-best lists, prefixes, terms and seeded samples: the same outputs and scores."""
    data, model = trained
    whole(data).save(tmp_path / "whole.txt")
    plain, listed = Translator.load(model, device="cpu"), Translator.load(model, device="cpu",
                                                                           shortlist=tmp_path / "whole.txt")
    for options in ({"beam": 3, "nbest": 3}, {"beam": 1}, {"prefixes": ["d c", "g", "", "c", "e"], "beam": 2},
                    {"constraints": [["a"], [], ["b c"], [], ["d"]], "avoid": [[], ["f"], [], [], []], "beam": 4},
                    {"sampling": True, "nbest": 3, "seed": 5}):
        assert listed.hypotheses(LINES, **options) == plain.hypotheses(LINES, **options), options


def test_what_a_search_must_output_comes_through_a_small_shortlist(trained, tmp_path):
    """A batch outputs only the candidates of its lines (with the frequent tokens and the specials),
    and each line's prefix and terms even where the shortlist lacks them."""
    data, model = trained
    small = make(data, first=0, best=1)
    small.save(tmp_path / "small.txt")
    translator = Translator.load(model, device="cpu", shortlist=tmp_path / "small.txt")
    vocab = translator.engine.bundle.tgt_vocab
    allowed = set(small.columns([translator.engine.source_ids(line) for line in LINES]).tolist())  # one batch
    assert len(allowed) < len(vocab)
    for hyps, line in zip(translator.hypotheses(LINES, beam=3, nbest=3), LINES):
        assert all({vocab.index[t] for t in h.tokens} <= allowed for h in hyps), line
    allowed = set(small.columns([translator.engine.source_ids("a b")]).tolist())
    assert not {vocab.index[w] for w in "hgfe"} & allowed  # what follows is not among the candidates of "a b"
    assert translator.translate(["a b"], prefixes=["h g"])[0].startswith("h g")
    assert "f e" in translator.translate(["a b"], constraints=[["f e"]], beam=4)[0]


def test_a_shortlist_of_another_vocabulary_is_refused_in_one_line(trained, tmp_path):
    data, model = trained
    other = synthetic_data_dir(tmp_path, n_train=40, n_valid=5, task="reverse", min_len=1, max_len=2, seed=9)
    cli("shortlist", other, "-o", tmp_path / "other.txt")
    source_digest = Shortlist.load(tmp_path / "other.txt").source_digest
    assert source_digest != make(data, 1, 1).source_digest
    result = cli("translate", "-m", model, "--shortlist", tmp_path / "other.txt", "--device", "cpu", input="a b\n")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "a shortlist for another source vocabulary than the model's" in result.output
    served = cli("serve", "-m", model, "--shortlist", tmp_path / "other.txt", "--device", "cpu")
    assert served.exit_code == 1 and "another source vocabulary" in served.output


def test_nmt_translate_and_the_server_take_a_shortlist(trained, tmp_path):
    from conftest import request, serving

    data, model = trained
    cli("shortlist", data, "-o", tmp_path / "s.txt", "--first", 2, "--best", 2)
    expected = Translator.load(model, device="cpu", shortlist=tmp_path / "s.txt").translate(LINES)
    result = cli("translate", "-m", model, "--shortlist", tmp_path / "s.txt", "--device", "cpu",
                 input="".join(line + "\n" for line in LINES))
    assert result.exit_code == 0 and result.stdout.splitlines() == expected
    _, url, _ = serving(tmp_path, "--shortlist", tmp_path / "s.txt", model=model)
    status, answer = request(url + "/translate", {"text": LINES})
    assert status == 200 and answer["translations"] == expected


@NEEDS_CTRANSLATE2
def test_the_ctranslate2_export_carries_the_shortlist_as_its_vocabulary_map(trained, tmp_path):
    import ctranslate2

    data, model = trained
    small = make(data, first=2, best=1)
    small.save(tmp_path / "small.txt")
    whole(data).save(tmp_path / "whole.txt")
    translator = Translator.load(model, device="cpu")
    tokens = [translator.engine.pipeline.tokens(translator.engine.source_ids(line)) for line in LINES]
    outputs = {}
    for name in ("small", "whole"):
        result = cli("export", "-m", model, "--format", "ctranslate2", "-o", tmp_path / name, "--shortlist",
                     tmp_path / f"{name}.txt")
        assert result.exit_code == 0, result.output
        assert (tmp_path / name / "vmap.txt").read_text().startswith("\t")
        ct2 = ctranslate2.Translator(str(tmp_path / name))
        outputs[name] = [r.hypotheses[0] for r in ct2.translate_batch(tokens, beam_size=1, use_vmap=True)]
        plain = [r.hypotheses[0] for r in ct2.translate_batch(tokens, beam_size=1)]
    assert outputs["whole"] == plain
    vocab = translator.engine.bundle.tgt_vocab
    for line_tokens, output in zip(tokens, outputs["small"]):
        allowed = {vocab.tokens[i] for i in small.columns([[translator.engine.bundle.src_vocab.index[t] for t in
                                                            line_tokens]]).tolist()}
        assert set(output) <= allowed
    assert cli("export", "-m", model, "--format", "transformers", "-o", tmp_path / "x", "--shortlist",
               tmp_path / "small.txt").exit_code == 2


def test_a_row_that_is_not_ids_is_named_by_its_line(trained, tmp_path):
    data, _ = trained
    make(data, 2, 2).save(tmp_path / "s.txt")
    lines = (tmp_path / "s.txt").read_text().split("\n")
    (tmp_path / "s.txt").write_text("\n".join(lines[:4] + ["4 x"] + lines[5:]))
    with pytest.raises(NmtError, match=f"^{tmp_path / 's.txt'}:5: more than 2 candidates, or an id outside"):
        Shortlist.load(tmp_path / "s.txt")


def test_the_server_names_the_pair_a_shortlist_is_for(trained, tmp_path):
    data, model = trained
    cli("shortlist", data, "-o", tmp_path / "s.txt")
    for flags, message in (([tmp_path / "s.txt"], "this server translates 2 language pairs; name the pair"),
                           ([f"x-y={tmp_path / 's.txt'}"], "no model for x-y is served")):
        result = cli("serve", "-m", f"a-b={model}", "-m", f"c-d={model}", "--device", "cpu", "--shortlist", *flags)
        assert result.exit_code == 1 and message in result.output, result.output
