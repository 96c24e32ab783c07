"""`nmt import` of a released MarianMTModel: the real configuration and tokenizer files of OPUS-MT
en-mg (../shared/data/opus-mt-en-mg: `</s>` 0, `<unk>` 1, `<pad>` last and the decoder's start,
swish, final_logits_bias) with random weights at a smaller width and depth. MarianTokenizer and
MarianMTModel are the oracle: token ids, logits, greedy translations and scores; beam search
against generate() on a model trained to end its sentences; round trips through `nmt export`."""

import json
import shutil

import pytest
import torch
from conftest import cli, multi30k_lines, opus_mt_release, request, serving, synthetic_pairs, write_lines

from nmt_cli.decode.translator import Translator
from nmt_cli.errors import NmtError
from nmt_cli.interop.importer import import_model
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.text.vocab import BOS_ID, EOS_ID

transformers = pytest.importorskip("transformers")



@pytest.fixture(scope="module")
def released(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("released")
    model = opus_mt_release(tmp / "hf")
    import_model(tmp / "hf", tmp / "imported.pt")
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp / "hf"))
    return tmp, model, tokenizer, Translator.load(tmp / "imported.pt", device="cpu")


# Releases besides en-mg's own layout: tc-big's </s> far from 0 and its ordinary <s> beside it,
# with the options released models differ in (an untied output, unscaled embeddings, GELU); a
# multilingual release's target language tags, with separate source and target vocabularies.
VARIANTS = {"en-mg": {}, "tc-big ids, untied, unscaled, gelu": {
    "eos": 44670, "bos": 44671, "tie_word_embeddings": False, "scale_embedding": False,
    "activation_function": "gelu"}, "multilingual, separate vocabularies": {
    "codes": (">>fra<<", ">>por<<"), "target_size": 30000}}


@pytest.fixture(scope="module", params=list(VARIANTS))
def any_release(request, released, tmp_path_factory):
    """`released`, and each variant made the same way."""
    if not VARIANTS[request.param]:
        return released
    tmp = tmp_path_factory.mktemp("variant")
    model = opus_mt_release(tmp / "hf", **VARIANTS[request.param])
    import_model(tmp / "hf", tmp / "imported.pt")
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp / "hf"))
    return tmp, model, tokenizer, Translator.load(tmp / "imported.pt", device="cpu")


def release_lines(tokenizer, count, split="train"):
    """Multi30k's first `count` English lines, each after one of the release's target language
    tags in turn where it has any (a multilingual release)."""
    codes = sorted(token for token in tokenizer.encoder if token.startswith(">>") and token.endswith("<<"))
    lines = multi30k_lines(count, split=split)
    return [f"{codes[k % len(codes)]} {line}" for k, line in enumerate(lines)] if codes else lines


def marian_ids(tokenizer, vocab, ids, source=False):
    """Our target (or `source`) ids as the release's (our <s> is its <pad>, the decoder's start)."""
    tokens = tokenizer.target_encoder if tokenizer.separate_vocabs and not source else tokenizer.encoder
    return [tokens["<pad>"] if i == BOS_ID else tokens[vocab.tokens[i]] for i in ids]


@pytest.mark.slow
def test_token_ids_are_marian_tokenizers(any_release):
    tmp, _, tokenizer, translator = any_release
    lines = multi30k_lines(1000) + [">>fra<< A tagged line.", "  spaced   out  ", ">>x<<", "Ünïcödé — “quotes” 3½"]
    pipeline = translator.engine.pipeline
    ours = [marian_ids(tokenizer, pipeline.src_vocab, pipeline.source_ids(line, k) + [EOS_ID], source=True)
            for k, line in enumerate(lines)]
    assert ours == tokenizer(lines)["input_ids"]
    german = multi30k_lines(200, "de")
    targets = [marian_ids(tokenizer, pipeline.tgt_vocab, pipeline.target_ids(line, k, "reference") + [EOS_ID])
               for k, line in enumerate(german)]
    assert targets == tokenizer(text_target=german)["input_ids"]


@pytest.mark.slow
def test_an_ordinary_s_token_keeps_its_row_and_is_written_as_transformers_decodes_it(any_release):
    """tc-big's vocabularies hold `<s>` as an ordinary entry: imported, it is one of ours (its own
    row: the logits test), and an output holding it is written as MarianTokenizer.decode writes it."""
    tmp, _, tokenizer, translator = any_release
    if "<s>" not in tokenizer.encoder:
        pytest.skip("this release's vocabulary has no <s> entry")
    pipeline = translator.engine.pipeline
    ordinary = pipeline.tgt_vocab.tokens.index("<s>", 4)
    for line in multi30k_lines(20, "de"):
        ids = pipeline.target_ids(line, 1, "reference")
        ids = ids[:2] + [ordinary] + ids[2:] + [ordinary]
        theirs = tokenizer.decode(marian_ids(tokenizer, pipeline.tgt_vocab, ids), skip_special_tokens=True)
        assert pipeline.text(ids) == theirs


@pytest.mark.slow
def test_logits_are_marian_mt_models(any_release):
    tmp, model, tokenizer, translator = any_release
    lines, german = release_lines(tokenizer, 16), multi30k_lines(16, "de")
    batch = tokenizer(lines, text_target=german, return_tensors="pt", padding=True)
    start = torch.full((16, 1), model.config.decoder_start_token_id)
    labels = batch["labels"].masked_fill(batch["labels"] == -100, tokenizer.pad_token_id)
    decoder_input = torch.cat([start, labels[:, :-1]], dim=1)
    with torch.no_grad():
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=decoder_input).logits
    pipeline = translator.engine.pipeline
    to_ours, source_to_ours = ({marian: ours for ours, marian in enumerate(marian_ids(
        tokenizer, vocab, range(len(vocab)), source=side == "source"))} for side, vocab in (
        ("target", pipeline.tgt_vocab), ("source", pipeline.src_vocab)))
    to_ours[model.config.decoder_start_token_id] = BOS_ID

    def ours_of(ids, mapping):
        return ids.apply_(lambda i: mapping[i])

    ours_model = translator.engine.generator.models.models[0]
    src = ours_of(batch["input_ids"].clone(), source_to_ours).masked_fill(batch["attention_mask"] == 0, 0)
    with torch.no_grad():
        ours = ours_model(src, ours_of(decoder_input.clone(), to_ours))
    columns = torch.tensor([to_ours[i] for i in range(theirs.size(-1))])
    real = decoder_input != tokenizer.pad_token_id
    real[:, 0] = True
    assert (ours[..., columns][real] - theirs[real]).abs().max().item() < 1e-4
    assert theirs[real].std().item() > 1  # logits that tell tokens apart


@pytest.mark.slow
def test_greedy_translations_are_generates_on_every_line(any_release):
    tmp, model, tokenizer, translator = any_release
    lines = release_lines(tokenizer, 100, split="val")
    length = 24  # generate's max_length: the start, 22 tokens and the forced </s>
    theirs = []
    for start in range(0, len(lines), 100):
        batch = tokenizer(lines[start:start + 100], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, num_beams=1, max_length=length, bad_words_ids=[[tokenizer.pad_token_id]])
        theirs += [[i for i in row.tolist()[1:] if i != tokenizer.pad_token_id] for row in out]
    _, found = translator.engine.search(lines, translator.search_config(beam=1, max_len_b=length - 2))
    vocab = translator.engine.pipeline.tgt_vocab
    ours = [marian_ids(tokenizer, vocab, hyps[0].tokens + [EOS_ID]) for hyps in found]
    assert ours == theirs
    assert len({tuple(row) for row in ours}) > len(lines) // 10  # translations that differ from line to line


@pytest.mark.slow
def test_beam_search_is_generates_on_every_layout(any_release):
    """The release's own rules (|Y|^1, the heuristic stopping, its forced </s> at the limit, which
    costs nothing) on random weights, whose outputs all reach the limit: where they are ranked. As
    text: these outputs hold pieces of the source side that target.spm lacks."""
    tmp, model, tokenizer, translator = any_release
    lines = release_lines(tokenizer, 40, split="val")
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=4, max_length=24, bad_words_ids=[[tokenizer.pad_token_id]])
    theirs = tokenizer.batch_decode(out, skip_special_tokens=True)
    for at_limit in ("free", "scored"):
        ours = translator.translate(lines, beam=4, max_len_b=22, at_limit=at_limit)
        equal = sum(a == b for a, b in zip(ours, theirs))
        assert equal == 40 if at_limit == "free" else equal < 40  # the rule is on trial


def test_the_released_settings_are_the_checkpoints_search(released):
    """config.json's num_beams 4, max_length 512 and bad_words_ids [[<pad>]] (transformers 5 reads
    them no longer; transformers 4 did), length penalty |Y|^1.0, the heuristic stopping, <unk>
    allowed (generate() has no rule against it), and 510 tokens before the forced </s> (which costs
    nothing); without forced_eos_token_id, 511 tokens and no </s>."""
    tmp, _, _, translator = released
    search = translator.config.search
    assert (search.beam, search.lenpen, search.lenpen_form, search.stopping) == (4, 1.0, "length", "heuristic")
    assert (search.max_len_a, search.max_len_b, search.allow_unk, search.at_limit) == (0.0, 510, True, "free")
    config = json.loads((tmp / "hf/config.json").read_text())
    shutil.copytree(tmp / "hf", tmp / "unforced")
    (tmp / "unforced/config.json").write_text(json.dumps(config | {"forced_eos_token_id": None}))
    import_model(tmp / "unforced", tmp / "unforced.pt")
    search = Translator.load(tmp / "unforced.pt").config.search
    assert (search.max_len_b, search.at_limit) == (511, "cut")
    assert Translator.load(tmp / "imported.pt", beam=2).config.search.beam == 2  # a given option wins
    about = json.loads(cli("info", "-m", tmp / "imported.pt", "--json").output)
    assert about["languages"] == "en-mg" and about["vocabulary"] == "54,689 shared" and about["language_codes"] == []
    assert about["subwords"] == "SentencePiece (one model per side)" and "swish" in about["architecture"]


def test_a_config_file_sets_the_toolkits_defaults_over_the_releases(released, tmp_path):
    """A file's value is given as a flag's is, even where it equals nmt-cli's default; the dump
    shows what translate runs with: the release's settings where nothing else is given."""
    model = released[0] / "imported.pt"
    dumped = cli("translate", "-m", model, "--dump-config").stdout
    assert all(line in dumped.splitlines() for line in ("beam: 4", "lenpen: 1.0", "lenpen-form: length",
                                                        "stopping: heuristic", "max-len-a: 0.0", "max-len-b: 510"))
    (tmp_path / "c.yaml").write_text("max-len-a: 1.0\nmax-len-b: 50\nbeam: 1\n")
    dumped = cli("translate", "-m", model, "--config", tmp_path / "c.yaml", "--dump-config").stdout.splitlines()
    assert "max-len-a: 1.0" in dumped and "max-len-b: 50" in dumped and "beam: 1" in dumped
    line = "A man in a red shirt is riding a bicycle down the street.\n"
    by_file = cli("translate", "-m", model, "--config", tmp_path / "c.yaml", "--device", "cpu", input=line)
    by_flags = cli("translate", "-m", model, "--max-len-a", 1.0, "--max-len-b", 50, "--beam", 1, "--device", "cpu",
                   input=line)
    assert by_file.exit_code == by_flags.exit_code == 0 and by_file.stdout == by_flags.stdout, by_file.output


@pytest.mark.slow
def test_scores_are_marian_mt_models(any_release, tmp_path):
    tmp, model, tokenizer, translator = any_release
    lines, german = release_lines(tokenizer, 8), multi30k_lines(8, "de")
    scored = translator.score(lines, german)
    batch = tokenizer(lines, text_target=german, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       labels=batch["labels"]).logits
    labels = batch["labels"]  # padded with <pad>
    log_probs = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    theirs = (log_probs * (labels != tokenizer.pad_token_id)).sum(1)
    assert [s.log_prob for s in scored] == pytest.approx(theirs.tolist(), rel=2e-5)  # sums of ~60 in float32
    pairs = write_lines(tmp_path / "pairs.tsv", [f"{s}\t{t}" for s, t in zip(lines, german)])
    result = cli("translate", "-m", tmp / "imported.pt", "--score-reference", "-i", pairs)
    assert result.exit_code == 0, result.output
    # (on stdout; stderr may warn of reference tokens that a drawn target vocabulary lacks)
    assert [float(x) for x in result.stdout.split()] == pytest.approx(theirs.tolist(), rel=2e-5)


@pytest.fixture(scope="module")
def trained_release(exported, tmp_path_factory):
    """The exported trained tiny model (it ends its sentences) as a release would be: transformers'
    generation settings, imported."""
    tmp, bundle, sources = exported
    directory = tmp_path_factory.mktemp("trained") / "hf"
    shutil.copytree(tmp / "hf", directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    generation.update(num_beams=4, length_penalty=1.0, early_stopping=False)
    (directory / "generation_config.json").write_text(json.dumps(generation))
    import_model(directory, directory.parent / "imported.pt")
    longer = [s for s, _ in synthetic_pairs(300, 77, min_len=6, max_len=14)]
    return directory, directory.parent / "imported.pt", sources + longer


@pytest.mark.slow
def test_beam_search_is_generates(trained_release):
    """The imported defaults (beam 4, |Y|^1.0, the heuristic stopping) against generate() with the
    release's generation_config.json."""
    directory, imported, sources = trained_release
    theirs = generated_lines(directory, sources)
    translator = Translator.load(imported, device="cpu")
    assert translator.config.search.stopping == "heuristic"
    ours = translator.translate(sources)
    assert sum(a == b for a, b in zip(ours, theirs)) >= 0.99 * len(sources)
    early = Translator.load(imported, device="cpu", stopping="early").translate(sources)
    assert early != ours  # the stopping rule is on trial on these lines


@pytest.mark.slow
def test_decoding_controls_are_generates(trained_release, tmp_path):
    """A release's min_new_tokens, no_repeat_ngram_size and repetition_penalty, imported: our beam
    search under them gives generate()'s output."""
    directory, imported, sources = trained_release
    shutil.copytree(directory, tmp_path / "hf")
    generation = json.loads((tmp_path / "hf/generation_config.json").read_text())
    generation.update(min_new_tokens=7, no_repeat_ngram_size=2, repetition_penalty=1.5)
    (tmp_path / "hf/generation_config.json").write_text(json.dumps(generation))
    import_model(tmp_path / "hf", tmp_path / "imported.pt")
    translator = Translator.load(tmp_path / "imported.pt", device="cpu")
    search = translator.config.search
    assert (search.min_len, search.no_repeat_ngram_size, search.repetition_penalty) == (7, 2, 1.5)
    ours, theirs = translator.translate(sources), generated_lines(tmp_path / "hf", sources)
    assert sum(a == b for a, b in zip(ours, theirs)) >= 0.99 * len(sources)
    plain = Translator.load(imported, device="cpu").translate(sources)
    assert sum(a != b for a, b in zip(ours, plain)) >= 0.2 * len(sources)  # the controls are on trial
    export = cli("export", "-m", tmp_path / "imported.pt", "--format", "transformers", "-o", tmp_path / "again")
    assert export.exit_code == 0, export.output  # and the controls go out again as generate()'s defaults
    again = json.loads((tmp_path / "again/generation_config.json").read_text())
    assert (again["min_new_tokens"], again["no_repeat_ngram_size"], again["repetition_penalty"]) == (7, 2, 1.5)


def generated_lines(directory, sources):
    """transformers' generate() of `sources` with the release's generation_config.json."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(directory)).eval()
    lines = []
    for start in range(0, len(sources), 100):
        batch = tokenizer(sources[start:start + 100], return_tensors="pt", padding=True)
        with torch.no_grad():
            lines += tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
    return lines


def weights(path):
    return ckpt.load(path)["model"]


@pytest.mark.slow
def test_an_imported_model_exported_and_imported_again_is_the_same(any_release):
    """Every layout, tc-big's ordinary `<s>` too (the export names our start another way)."""
    tmp = any_release[0]
    assert cli("export", "-m", tmp / "imported.pt", "--format", "transformers", "-o", tmp / "again").exit_code == 0
    import_model(tmp / "again", tmp / "again.pt")
    first, second = ckpt.load(tmp / "imported.pt"), ckpt.load(tmp / "again.pt")
    assert first["model"].keys() == second["model"].keys()
    assert all(torch.equal(first["model"][k], second["model"][k]) for k in first["model"])
    for key in ("model_config", "src_vocab", "tgt_vocab", "sentencepiece", "target_sentencepiece"):
        assert first[key] == second[key], key
    assert first["released"]["search"] == second["released"]["search"]
    card = (tmp / "again/README.md").read_text()
    assert "early_stopping False), both dividing" in card and "Both stop an output after 510 tokens" in card


@pytest.mark.slow
def test_a_model_that_starts_from_eos_exports_and_imports_as_generate_runs_it(released, tmp_path):
    """A decoder that starts from </s>'s row (fairseq's way): the export says so, generate's
    greedy search gives our tokens, and the import reads it back as it was."""
    checkpoint = ckpt.load(released[0] / "imported.pt")
    checkpoint["model_config"]["decoder_start"] = "eos"
    ckpt.save(checkpoint, tmp_path / "eos.pt")
    assert cli("export", "-m", tmp_path / "eos.pt", "--format", "transformers", "-o", tmp_path / "hf").exit_code == 0
    model = transformers.MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp_path / "hf"))
    lines = multi30k_lines(40, split="val")
    with torch.no_grad():
        out = model.generate(**tokenizer(lines, return_tensors="pt", padding=True), num_beams=1, max_length=12)
    translator = Translator.load(tmp_path / "eos.pt", device="cpu")
    _, found = translator.engine.search(lines, translator.search_config(beam=1, max_len_b=10))
    assert [hyps[0].tokens + [EOS_ID] for hyps in found] == \
        [[i for i in row.tolist()[1:] if i != tokenizer.pad_token_id] for row in out]
    import_model(tmp_path / "hf", tmp_path / "again.pt")
    again = ckpt.load(tmp_path / "again.pt")
    assert again["model_config"] == checkpoint["model_config"]
    assert all(torch.equal(tensor, again["model"][name]) for name, tensor in checkpoint["model"].items())


@pytest.mark.slow
def test_an_output_cut_at_the_limit_exports_and_imports_as_it_was(released, tmp_path):
    """A release without a forced </s> (`--at-limit cut`): the export forces none and lets
    generate() stop after the limit's tokens, so the import reads the same search back."""
    checkpoint = ckpt.load(released[0] / "imported.pt")
    checkpoint["released"]["search"].update(at_limit="cut", max_len_b=511)
    ckpt.save(checkpoint, tmp_path / "cut.pt")
    assert cli("export", "-m", tmp_path / "cut.pt", "--format", "transformers", "-o", tmp_path / "hf").exit_code == 0
    generation = json.loads((tmp_path / "hf/generation_config.json").read_text())
    assert generation.get("forced_eos_token_id") is None and generation["max_length"] == 512  # the start + 511
    import_model(tmp_path / "hf", tmp_path / "again.pt")
    assert ckpt.load(tmp_path / "again.pt")["released"]["search"] == checkpoint["released"]["search"]


@pytest.mark.slow
def test_a_trained_model_exported_and_imported_translates_as_it_did(exported, tmp_path):
    tmp, bundle, sources = exported
    import_model(tmp / "hf", tmp_path / "imported.pt")
    original, imported = ckpt.load(tmp / "ck/checkpoint_last.pt"), ckpt.load(tmp_path / "imported.pt")
    for name, tensor in original["model"].items():
        assert torch.equal(tensor, imported["model"][name]), name
    assert not imported["model"]["output_projection.bias"].any()  # Marian's bias, zero
    ours = {"lenpen_form": "gnmt", "stopping": "early", "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 50,
            "allow_unk": False}
    assert Translator.load(tmp_path / "imported.pt", **ours).translate(sources) == \
        Translator.load(tmp / "ck/checkpoint_last.pt").translate(sources)


@pytest.mark.slow
def test_everything_runs_on_an_imported_model(released, tmp_path):
    tmp, model, tokenizer, translator = released
    lines = multi30k_lines(20)
    source = write_lines(tmp_path / "in.en", lines)
    result = cli("translate", "-m", tmp / "imported.pt", "-i", source, "--beam", 1, "--max-len-b", 12)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == translator.translate(lines, beam=1, max_len_b=12)
    result = cli("translate", "-m", tmp / "imported.pt", "-i", source, "--beam", 1, "--max-len-b", 12,
                 "--quantize", "int8")
    assert result.exit_code == 0 and len(result.output.splitlines()) == 20, result.output
    assert cli("average-checkpoints", "--inputs", tmp / "imported.pt", tmp / "imported.pt",
               "-o", tmp_path / "avg.pt").exit_code == 0
    assert all(torch.equal(a, b) for a, b in zip(weights(tmp_path / "avg.pt").values(),
                                                 weights(tmp / "imported.pt").values()))
    from nmt_cli.run_config import ServeConfig
    from nmt_cli.serve.schemas import search_config

    search = search_config({"beam": 2}, 1, ServeConfig(), translator.config.search)
    assert (search.beam, search.stopping, search.lenpen_form, search.max_len_b) == (2, "heuristic", "length", 256)


@pytest.mark.slow
def test_nmt_serve_answers_with_the_releases_settings(released, tmp_path):
    import signal

    tmp, _, _, translator = released
    _, url, process = serving(tmp_path, "--max-output-tokens", 12, model=tmp / "imported.pt")
    try:
        status, answer = request(url + "/translate", {"text": multi30k_lines(3)})
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert status == 200 and answer["translations"] == translator.translate(multi30k_lines(3), max_len_b=12)


@pytest.mark.slow
def test_ctranslate2_greedy_is_ours(released, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    tmp, _, _, translator = released
    assert cli("export", "-m", tmp / "imported.pt", "--format", "ctranslate2", "-o", tmp_path / "ct2").exit_code == 0
    lines = multi30k_lines(100)
    pipeline = translator.engine.pipeline
    sources = [pipeline.src_vocab.decode(pipeline.source_ids(line, k)) for k, line in enumerate(lines)]
    results = ctranslate2.Translator(str(tmp_path / "ct2")).translate_batch(sources, beam_size=1,
                                                                           max_decoding_length=16)
    _, found = translator.engine.search(lines, translator.search_config(beam=1, max_len_b=16))
    ours = [pipeline.tgt_vocab.decode(hyps[0].tokens) for hyps in found]
    assert [r.hypotheses[0] for r in results] == ours


def test_a_multilingual_model_lists_its_codes_and_warns_once_of_a_line_without(tmp_path):
    directory = tmp_path / "hf"
    opus_mt_release(directory)
    vocab = json.loads((directory / "vocab.json").read_text())
    codes = {">>fra<<": 54000, ">>por<<": 54001}
    vocab = {token: i for token, i in vocab.items() if i not in codes.values()} | codes
    (directory / "vocab.json").write_text(json.dumps(vocab))
    import_model(directory, tmp_path / "m.pt")
    about = json.loads(cli("info", "-m", tmp_path / "m.pt", "--json").output)
    assert about["language_codes"] == [">>fra<<", ">>por<<"]
    warnings = []
    translator = Translator.load(tmp_path / "m.pt", warn=warnings.append, beam=1, max_len_b=3)
    translator.translate([">>por<< Hello.", "Hello.", "World."])
    assert len(warnings) == 1 and "line 2" in warnings[0] and ">>fra<<" in warnings[0]
    pipeline = translator.engine.pipeline
    assert pipeline.source_ids(">>por<< Hello.", 1)[0] == pipeline.src_vocab.index[">>por<<"]


@pytest.mark.slow
def test_fine_tuning_an_imported_model_lowers_its_loss_and_keeps_its_release(released, tmp_path):
    """Fine-tuned (nmt train --init-from), an imported model learns, averages and keeps its search
    settings (resuming such a run is exact: tests/train/test_run.py)."""
    tmp = released[0]
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, start, n in (("train", 0, 300), ("valid", 1000, 50)):
        for lang in ("en", "de"):
            write_lines(raw / f"{split}.{lang}", multi30k_lines(start + n, lang)[start:])
    result = cli("preprocess", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "valid",
                 "--destdir", tmp_path / "data", "--from-model", tmp / "imported.pt", "--quiet", "--workers", 1,
                 "--max-len-ratio", 4)  # German in Malagasy pieces is long
    assert result.exit_code == 0, result.output
    assert f"warning: {tmp / 'imported.pt'} translates en-mg, the data is en-de: " in result.output
    assert f"warning: {raw / 'train.de'}: the model's subwords cut it into 2.9 tokens a word, 0.0% of them " \
        in result.output and f"{raw / 'train.en'}:" not in result.output  # Malagasy pieces, English ones
    common = ["train", tmp_path / "data", "--init-from", tmp / "imported.pt", "--max-tokens", 600, "--lr-schedule",
              "inverse-sqrt", "--lr", 1e-3, "--warmup", 5, "--device", "cpu", "--threads", 1, "--quiet",
              "--validate-interval-updates", 10, "--dropout", 0.0]
    result = cli(*common, "--save-dir", tmp_path / "whole", "--max-updates", 20)
    assert result.exit_code == 0, result.output
    assert f"nmt train: warning: {tmp / 'imported.pt'} translates en-mg, the data is en-de: " in result.output
    log = [json.loads(line) for line in (tmp_path / "whole/train_log.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in log if row["kind"] == "valid"]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    averaged = cli("average-checkpoints", "--dir", tmp_path / "whole", "--last", 2, "-o", tmp_path / "avg.pt")
    assert averaged.exit_code == 0 and Translator.load(tmp_path / "avg.pt", beam=1).translate(["A dog."])
    fine_tuned = ckpt.load(tmp_path / "whole/checkpoint_last.pt")
    assert fine_tuned["released"] == ckpt.load(tmp / "imported.pt")["released"]  # its search settings stay
    refused = cli(*common, "--save-dir", tmp_path / "other", "--d-model", 128)
    assert refused.exit_code != 0 and "--d-model" in refused.output and "Traceback" not in refused.output


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "vocab.json").unlink(), "vocab.json: missing"),
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "bart"})), "model_type 'bart'"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:5000]),
     "model.safetensors: unreadable or truncated"),
    (lambda d: (d / "source.spm").write_bytes(b"garbage"), "source.spm: not a SentencePiece model"),
    (lambda d: configured(d, activation_function="mish"), "'mish'"),
    (lambda d: (d / "config.json").write_text("[" * 100_000 + "]" * 100_000), "config.json: JSON nested too deeply"),
    (lambda d: ((d / "source.spm").unlink(), (d / "source.spm").symlink_to("/dev/zero")),
     "source.spm: a character device, not a regular file"),
    (lambda d: configured(d, num_beams=0), "config.json: num_beams 0: expected an integer of at least 1"),
    (lambda d: configured(d, num_beams=4.5), "config.json: num_beams 4.5: expected an integer of at least 1"),
    (lambda d: configured(d, max_length=-1), "config.json: max_length -1: expected an integer of at least 1"),
    (lambda d: configured(d, bad_words_ids="x"), "config.json: bad_words_ids x: expected lists of ids"),
    (lambda d: configured(d, vocab_size=100), "config.json: vocab_size 100, where vocab.json holds 54,688 tokens"),
    (lambda d: poisoned(d), ": tensor decoder_layers.0.ffn.w1.weight holds NaN or infinite values"),
    (lambda d: declaring(d, (1 << 20, 1 << 20)), "model.safetensors: unreadable or truncated (tensor "),
    (lambda d: (d / "model.safetensors").write_bytes((1 << 62).to_bytes(8, "little") + b"{}"),
     "model.safetensors: unreadable or truncated (a header of 4,611,686,018,427,387,904 bytes in a file of 10)"),
])
def test_a_damaged_release_is_refused_in_one_line_and_nothing_is_written(released, tmp_path, damage, message):
    """Each refusal names the release's file (not the output), before anything is written."""
    directory = tmp_path / "hf"
    shutil.copytree(released[0] / "hf", directory)
    damage(directory)
    result = cli("import", directory, "-o", tmp_path / "out.pt")
    assert result.exit_code == 1 and result.output.startswith(f"Error: {directory}"), result.output
    assert message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == [directory]


def configured(directory, **changes):
    """`changes` made to a release's config.json."""
    (directory / "config.json").write_text(json.dumps({**json.loads((directory / "config.json").read_text()),
                                                       **changes}))


def poisoned(directory):
    """A NaN in a release's weights."""
    from safetensors.torch import load_file, save_file

    weights = load_file(directory / "model.safetensors")
    weights["model.decoder.layers.0.fc1.weight"][0, 0] = float("nan")
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


def declaring(directory, shape):
    """model.safetensors whose header declares one tensor of `shape` (float32), nothing else changed:
    refused before anything is allocated."""
    data = (directory / "model.safetensors").read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    name = next(name for name in header if name != "__metadata__")
    header[name]["shape"] = list(shape)
    text = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])


def test_pickled_code_in_pytorch_model_bin_is_refused(released, tmp_path):
    directory = tmp_path / "hf"
    shutil.copytree(released[0] / "hf", directory)
    (directory / "model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return (print, ("ran code from the file",))

    torch.save({"x": Payload()}, directory / "pytorch_model.bin")
    with pytest.raises(NmtError, match=r"pytorch_model.bin: refused: it holds \S*print, not a transformers model's "
                                       r"weights \(nothing in it was run\)$"):
        import_model(directory, tmp_path / "out.pt")
    torch.save({"model.shared.weight": torch.zeros(1).expand(2**16, 2**15)}, directory / "pytorch_model.bin")
    with pytest.raises(NmtError, match=r"pytorch_model.bin: model.shared.weight: a tensor of shape \(65536, 32768\) "
                                       r"over a storage of 4 bytes"):  # refused before a copy of 8 GB
        import_model(directory, tmp_path / "out.pt")
