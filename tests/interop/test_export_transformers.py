"""`nmt export --format transformers`: transformers loads the directory (model and tokenizer) and
computes our logits; greedy `generate` gives `nmt translate --beam 1`'s lines and beam search
mostly ours; what Marian cannot hold is refused in one line; a model card tells what the model is."""

import dataclasses
import json

import pytest
import torch
import yaml
from click.testing import CliRunner
from conftest import NEEDS_CTRANSLATE2, block_import, tiny_checkpoint, tiny_sentencepiece_checkpoint

from nmt_cli.cli import main
from nmt_cli.decode.pipeline import TextPipeline
from nmt_cli.errors import NmtError
from nmt_cli.interop.export_transformers import check_marian
from nmt_cli.interop.release import sines_then_cosines
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID

pytestmark = pytest.mark.slow  # every test here builds and exports a model (the `exported` fixture)

transformers = pytest.importorskip("transformers")


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def loaded(tmp):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp / "hf"))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp / "hf")).eval()
    assert type(tokenizer).__name__ == "MarianTokenizer" and type(model).__name__ == "MarianMTModel"
    return tokenizer, model


def test_the_tokenizer_gives_our_ids_and_the_model_our_logits(exported):
    tmp, bundle, sources = exported
    tokenizer, model = loaded(tmp)
    pipeline = TextPipeline(bundle, 64)
    references = (tmp / "raw/valid.tgt").read_text().splitlines()
    batch = tokenizer(sources, text_target=references, return_tensors="pt", padding=True)
    src = [pipeline.source_ids(line, i) + [EOS_ID] for i, line in enumerate(sources)]
    tgt = [pipeline.target_ids(line, i, "reference") + [EOS_ID] for i, line in enumerate(references)]
    assert [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])] == src
    assert [[i for i in row.tolist() if i != -100 and i != PAD_ID] for row in batch["labels"]] == tgt
    assert max(map(len, src)) > min(map(len, src))  # padding is on trial

    def padded(rows):
        return torch.tensor([row + [PAD_ID] * (max(map(len, rows)) - len(row)) for row in rows])

    tgt_in = padded([[BOS_ID] + row[:-1] for row in tgt])
    with torch.no_grad():
        ours = bundle.model(padded(src), tgt_in)
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=tgt_in).logits
    real = tgt_in != PAD_ID
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-4
    assert ours[real].abs().max().item() > 1  # logits of a trained model, not zeros


def translated(tmp, sources, *flags):
    result = run("translate", "-m", tmp / "ck/checkpoint_last.pt", "--device", "cpu", "--max-len-a", 0,
                 "--max-len-b", 1000, *flags, input="\n".join(sources) + "\n")
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def generated(tmp, sources, **kwargs):
    tokenizer, model = loaded(tmp)
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        outputs = model.generate(**batch, **kwargs)
    return tokenizer.batch_decode(outputs, skip_special_tokens=True), outputs


def test_greedy_generate_gives_nmt_translate_beam_1_lines(exported):
    tmp, bundle, sources = exported
    ours = translated(tmp, sources, "--beam", 1)
    theirs, outputs = generated(tmp, sources, num_beams=1)
    assert theirs == ours
    ended = sum(EOS_ID in row.tolist() and (row != PAD_ID).sum() < 65 for row in outputs)  # not forced
    assert ended == len(sources)  # each ends with </s> (searches that run to the limit would not say much)
    assert sum(line.replace(" ", "").lower() == s.replace(" ", "") for line, s in zip(ours, sources)) \
        >= len(sources) // 4  # the model has learnt its task (the rest are near-copies)


def test_beam_search_with_the_same_length_penalty_mostly_agrees(exported):
    """Without a length penalty both rank hypotheses by log-probability, but we stop a sentence
    once `beam` hypotheses have ended (fairseq's rule) where transformers goes on while a live one
    can still beat the worst ended one: now and then it finds a longer, more probable output."""
    tmp, bundle, sources = exported
    ours = translated(tmp, sources, "--beam", 4, "--lenpen", 0)
    theirs, _ = generated(tmp, sources, num_beams=4, length_penalty=0.0)
    assert sum(a == b for a, b in zip(ours, theirs)) >= 0.95 * len(sources)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("stopping", ["early", "heuristic"])
def test_beam_search_with_transformers_rules_gives_generates_lines(exported, alpha, stopping):
    """With transformers' length penalty (|Y|^alpha) and its stopping rule (early_stopping True:
    ours, fairseq's; False: its heuristic), our beam search gives generate()'s output on every line."""
    tmp, bundle, sources = exported
    ours = translated(tmp, sources, "--beam", 4, "--lenpen", alpha, "--lenpen-form", "length", "--stopping", stopping)
    theirs, _ = generated(tmp, sources, num_beams=4, length_penalty=alpha, early_stopping=stopping == "early")
    assert ours == theirs


def test_generation_defaults_are_ours(exported):
    tmp, bundle, _ = exported
    _, model = loaded(tmp)
    generation = model.generation_config
    assert generation.decoder_start_token_id == BOS_ID and generation.forced_eos_token_id == EOS_ID
    assert generation.num_beams == 4 and generation.length_penalty == 0.6 and generation.max_length == 65
    assert [PAD_ID] in generation.bad_words_ids and [BOS_ID] in generation.bad_words_ids
    config = json.loads((tmp / "hf/config.json").read_text())
    shared = bundle.src_vocab is bundle.tgt_vocab
    assert config["share_encoder_decoder_embeddings"] == shared
    assert (config["vocab_size"], config["decoder_vocab_size"]) == (len(bundle.src_vocab), len(bundle.tgt_vocab))
    assert (tmp / "hf/target_vocab.json").is_file() != shared
    vocabularies = [json.loads((tmp / f"hf/{name}").read_text()) for name in ("vocab.json", "target_vocab.json")
                    if (tmp / f"hf/{name}").is_file()]
    assert [list(v) for v in vocabularies] == [bundle.src_vocab.tokens] + ([] if shared else [bundle.tgt_vocab.tokens])


def test_the_model_card_says_what_the_model_is_and_was_trained_on(exported):
    tmp, bundle, _ = exported
    card = (tmp / "hf/README.md").read_text()
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp / "hf").iterdir()}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as every other file
    params = sum(p.numel() for p in {id(p): p for p in bundle.model.parameters()}.values())
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "other" and front["license_link"] == "LICENSE" and front["language"] == ["src", "tgt"]
    assert "has not been set" in (tmp / "hf/LICENSE").read_text()
    assert "## Intended use and limitations" in card and "Inputs longer than 63 pieces are cut" in card
    assert "@inproceedings{vaswani2017attention" in card
    assert f"{params:,} parameters" in card and "2 encoder and 2 decoder layers, d_model 32" in card
    assert "- train: train.src, train.tgt (400 pairs)\n- valid: valid.src, valid.tgt (40 pairs)\n" in card
    assert "- updates: 400" in card and "AutoModelForSeq2SeqLM.from_pretrained" in card
    assert "`generate` stops an output after 63 tokens, `nmt translate` after 1 x its source's tokens + 50" in card
    if bundle.src_vocab is bundle.tgt_vocab:
        assert "BLEU" not in card and "model-index" not in front
    else:  # trained with --eval-bleu
        assert "- best validation BLEU in training: " in card and "sacreBLEU nrefs:1|case:mixed|eff:no|tok:13a" in card
        (result,) = front["model-index"][0]["results"]
        assert result["dataset"] == {"name": "valid.src, valid.tgt", "type": "valid"}
        assert result["metrics"][0]["type"] == "bleu" and "tok:13a" in result["metrics"][0]["args"]


def test_a_test_set_whose_sides_differ_in_length_is_one_line(exported, tmp_path):
    tmp, _, _ = exported
    (tmp_path / "short.tgt").write_text("a\n")
    result = run("export", "-m", tmp / "ck/checkpoint_last.pt", "--format", "transformers", "-o", tmp_path / "hf",
                 "--eval", tmp / "raw/valid.src", tmp_path / "short.tgt")
    assert result.exit_code == 1 and "has 40 lines but" in result.output and "line counts differ" in result.output
    assert not (tmp_path / "hf").exists()


def test_the_card_scores_a_test_set_as_nmt_score_does_and_states_the_licence(exported, tmp_path):
    """`--eval SRC REF`: the checkpoint's translations of SRC scored against REF, the same scores
    as `nmt translate` then `nmt score` give, in the card and its model-index."""
    tmp, _, _ = exported
    model, source, reference = tmp / "ck/checkpoint_last.pt", tmp / "raw/valid.src", tmp / "raw/valid.tgt"
    result = run("export", "-m", model, "--format", "transformers", "-o", tmp_path / "hf", "--eval", source, reference,
                 "--license", "apache-2.0")
    assert result.exit_code == 0, result.output
    card = (tmp_path / "hf/README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "apache-2.0" and "license_name" not in front
    assert not (tmp_path / "hf/LICENSE").exists()
    translated = run("translate", "-m", model, "-i", source, "-o", tmp_path / "hyp", "--device", "cpu")
    assert translated.exit_code == 0, translated.output
    scores = [json.loads(line) for line in run("score", "-r", reference, "-i", tmp_path / "hyp", "-m", "bleu", "-m",
                                               "chrf", "--json").stdout.splitlines()]
    test = front["model-index"][0]["results"][-1]
    assert test["dataset"] == {"name": "valid.src, valid.tgt", "type": "test"}
    assert [(m["type"], m["value"]) for m in test["metrics"]] == [(s["metric"], round(s["score"], 2)) for s in scores]
    assert f"- valid.src, valid.tgt (beam 4, length penalty 0.6): {scores[0]['text']}" in card
    for flags, message in ((["--license", "mit", "--license-name", "x"], "--license-name applies only with "
                                                                          "--license other"),
                           (["--format", "ctranslate2", "--eval", source, reference], "--eval applies only to "
                                                                                       "--format transformers")):
        result = run("export", "-m", model, "--format", "transformers", "-o", tmp_path / "x", *flags)
        assert result.exit_code == 2 and message in result.output, result.output


def test_our_sinusoid_permuted_is_marians():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from nmt_cli.model.transformer import positional_encoding

    ours = positional_encoding(50, 16)
    theirs = MarianSinusoidalPositionalEmbedding(50, 16).create_weight()
    assert torch.allclose(ours[:, sines_then_cosines(16)], theirs, atol=1e-6)


@pytest.mark.parametrize("overrides, message", [
    ({"norm": "pre"}, "MarianMTModel cannot hold a pre-norm model (MarianMTModel's layers are post-norm)"),
    ({"positions": "learned"}, "MarianMTModel cannot hold learned positions (Marian's are sinusoidal)"),
    ({"embedding_norm": True}, "MarianMTModel cannot hold a layer norm on the embeddings"),
    ({"d_k": 8, "d_v": 8}, "MarianMTModel cannot hold d_k 8 and d_v 8 (Marian's heads are d_model / heads = 16"),
    ({"d_model": 33, "heads": 3}, "MarianMTModel cannot hold an odd d_model"),
    ({}, "MarianTokenizer holds only SentencePiece models, and this one reads whitespace tokens; train on "
         "`nmt preprocess --subword sentencepiece` data"),
])
def test_what_marian_cannot_hold_is_refused_in_one_line(tmp_path, overrides, message):
    model = tiny_checkpoint(tmp_path / "m.pt", **overrides)
    result = run("export", "-m", model, "--format", "transformers", "-o", tmp_path / "hf")
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists()


def test_moses_bpe_and_lowercased_models_are_refused(exported):
    _, bundle, _ = exported
    moses = dataclasses.replace(bundle, text=dataclasses.replace(bundle.text, subword="bpe", tokenizer="moses"),
                                bpe_codes="#version: 0.2\n")
    with pytest.raises(NmtError, match="reads Moses tokenization and BPE; train on `nmt preprocess --subword"):
        check_marian(moses)
    lowercased = dataclasses.replace(bundle, text=dataclasses.replace(bundle.text, lowercase=True))
    with pytest.raises(NmtError, match="MarianTokenizer does not lowercase; train without --lowercase"):
        check_marian(lowercased)


@NEEDS_CTRANSLATE2
def test_an_export_replaces_only_an_earlier_export(exported, tmp_path):
    tmp, _, _ = exported
    model, out = tmp / "ck/checkpoint_last.pt", tmp_path / "hf"
    for fmt in ("ctranslate2", "transformers", "transformers"):  # each replaces the one before
        result = run("export", "-m", model, "--format", fmt, "-o", out)
        assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file() and not (out / "model.bin").exists()
    (out / "notes.txt").write_text("mine")
    result = run("export", "-m", model, "--format", "transformers", "-o", out)
    assert result.exit_code == 1 and "choose another --output" in result.output
    assert (out / "notes.txt").read_text() == "mine"
    result = run("export", "-m", model, "--format", "transformers", "-o", tmp_path / "x", "--quantization", "int8")
    assert result.exit_code == 2 and "--quantization applies only to --format ctranslate2" in result.output
    for card in (["--license", "mit"], ["--eval", model, model]):
        result = run("export", "-m", model, "--format", "safetensors", "-o", tmp_path / "x.safetensors", *card)
        assert result.exit_code == 2 and f"{card[0]} applies only to --format transformers" in result.output


def test_without_transformers_the_export_says_how_to_install_it(tmp_path, monkeypatch):
    model = tiny_checkpoint(tmp_path / "m.pt")
    block_import(monkeypatch, "transformers")
    result = run("export", "-m", model, "--format", "transformers", "-o", tmp_path / "hf")
    assert result.exit_code == 1 and "--format transformers needs transformers: pip install 'nmt-cli[export]'" \
        in result.output and len(result.output.strip().splitlines()) == 1


def test_at_the_length_limit_both_stop_after_the_same_tokens(tmp_path):
    """An untrained model runs on to the limit: max_positions - 1 tokens, then </s>, on both sides."""
    model = tiny_sentencepiece_checkpoint(tmp_path / "m.pt")
    assert run("export", "-m", model, "--format", "transformers", "-o", tmp_path / "hf").exit_code == 0
    sources = ["a b c", "d e f g", "h a"]
    result = run("translate", "-m", model, "--beam", 1, "--max-len-a", 0, "--max-len-b", 1000, "--format", "jsonl",
                 input="\n".join(sources) + "\n")
    lengths = [len(json.loads(line)["nbest"][0]["tokens"]) for line in result.output.splitlines()]
    theirs, outputs = generated(tmp_path, sources, num_beams=1)
    assert 63 in lengths and [(row != PAD_ID).sum().item() - 2 for row in outputs] == lengths
    assert theirs == [json.loads(line)["translation"] for line in result.output.splitlines()]


def test_a_file_size_limit_is_one_line_and_nothing_is_written(tmp_path):
    """A full disk or a file-size limit while transformers writes the weights (its safetensors
    writer's own error, not an OSError): one line, no directory."""
    import resource
    import signal
    import subprocess
    import sys

    model = tiny_sentencepiece_checkpoint(tmp_path / "m.pt")

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    done = subprocess.run([sys.executable, "-m", "nmt_cli", "export", "-m", str(model), "--format", "transformers",
                           "-o", str(tmp_path / "hf")], preexec_fn=limited, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == f"Error: {tmp_path / 'hf'}: cannot write the model directory (File too large); " \
        "nothing was written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]
