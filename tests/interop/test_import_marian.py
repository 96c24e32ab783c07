"""`nmt import` of Marian's own release format (model.npz with its model.yml inside, decoder.yml,
a vocabulary .yml, the .spm files), written out here with random weights and OPUS-MT en-mg's real
vocabulary and SentencePiece models. CTranslate2's Marian converter reads the same files: its
greedy translations and ours are the same, post-norm and pre-norm, with each activation, tied or
untied output."""

import io
import json
import re
import shutil
import zipfile

import numpy as np
import pytest
from conftest import EN_MG, cli, multi30k_lines

from nmt_cli.decode.translator import Translator
from nmt_cli.errors import NmtError
from nmt_cli.interop.importer import import_model
from nmt_cli.run_config import ImportConfig

D, FFN, HEADS, LAYERS = 64, 128, 4, 2


def marian_release(directory, norm="post", activation="swish", output="tied", seed=0, **config):
    """A Marian release: its vocabulary is en-mg's without <pad> (Marian has none: </s> 0, <unk> 1)."""
    if not (EN_MG / "vocab.json").is_file():
        pytest.skip(f"opus-mt-en-mg not found at {EN_MG} (set NMT_SHARED_DATA)")
    directory.mkdir()
    ids = json.loads((EN_MG / "vocab.json").read_text())
    tokens = sorted((t for t in ids if t != "<pad>"), key=ids.__getitem__)
    (directory / "vocab.yml").write_text("".join(f"{json.dumps(t, ensure_ascii=False)}: {i}\n"
                                                 for i, t in enumerate(tokens)), encoding="utf-8")
    rng = np.random.default_rng(seed)

    def normal(*shape, mean=0.0, std=0.15):
        return rng.normal(mean, std, shape).astype(np.float32)

    pre = norm == "pre"
    suffix = "_pre" if pre else ""
    weights = {"Wemb": normal(len(tokens), D), "decoder_ff_logit_out_b": normal(1, len(tokens), std=1.0)}
    if output == "untied":
        weights["decoder_ff_logit_out_W"] = normal(D, len(tokens))
    for side in ("encoder", "decoder"):
        for i in range(1, LAYERS + 1):
            for attention in ["self"] + (["context"] if side == "decoder" else []):
                scope = f"{side}_l{i}_{attention}"
                for p in "qkvo":
                    weights[f"{scope}_W{p}"], weights[f"{scope}_b{p}"] = normal(D, D), normal(1, D, std=0.1)
                weights[f"{scope}_Wo_ln_scale{suffix}"] = normal(1, D, mean=1.0)
                weights[f"{scope}_Wo_ln_bias{suffix}"] = normal(1, D, std=0.1)
            scope = f"{side}_l{i}_ffn"
            weights[f"{scope}_W1"], weights[f"{scope}_b1"] = normal(D, FFN), normal(1, FFN, std=0.1)
            weights[f"{scope}_W2"], weights[f"{scope}_b2"] = normal(FFN, D), normal(1, D, std=0.1)
            weights[f"{scope}_ffn_ln_scale{suffix}"] = normal(1, D, mean=1.0)
            weights[f"{scope}_ffn_ln_bias{suffix}"] = normal(1, D, std=0.1)
        if pre:
            weights[f"{side}_top_ln_scale"], weights[f"{side}_top_ln_bias"] = normal(1, D, mean=1.0), normal(1, D)
    yml = {"type": "transformer", "dim-emb": D, "enc-depth": LAYERS, "dec-depth": LAYERS, "transformer-heads": HEADS,
           "transformer-dim-ffn": FFN, "transformer-ffn-depth": 2, "transformer-ffn-activation": activation,
           "transformer-preprocess": "n" if pre else "", "transformer-postprocess": "da" if pre else "dan",
           "transformer-postprocess-top": "n" if pre else "", "transformer-postprocess-emb": "d",
           "transformer-decoder-autoreg": "self-attention", "transformer-no-projection": False,
           "transformer-guided-alignment-layer": "last", "tied-embeddings-all": output == "tied",
           "dim-vocabs": [len(tokens), len(tokens)], **config}
    text = "".join(f"{key}: {json.dumps(value)}\n" for key, value in yml.items())
    weights["special:model.yml"] = np.frombuffer(text.encode() + b"\0", dtype=np.int8)
    np.savez(directory / "model.npz", **weights)
    (directory / "decoder.yml").write_text("models:\n  - model.npz\nvocabs:\n  - vocab.yml\n  - vocab.yml\n"
                                           "beam-size: 6\nnormalize: 0.6\n")
    for name in ("source.spm", "target.spm"):
        shutil.copy(EN_MG / name, directory / name)
    return directory


@pytest.mark.parametrize("norm, activation, output", [("post", "swish", "tied"), ("pre", "gelu", "untied"),
                                                      ("post", "relu", "untied")])
@pytest.mark.slow
def test_greedy_translations_are_ctranslate2s(tmp_path, norm, activation, output):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import MarianConverter
    from ctranslate2.converters.marian import load_vocab

    directory = marian_release(tmp_path / "release", norm, activation, output)
    import_model(directory, tmp_path / "imported.pt")
    MarianConverter(str(directory / "model.npz"), [str(directory / "vocab.yml")] * 2).convert(str(tmp_path / "ct2"))
    translator = Translator.load(tmp_path / "imported.pt", device="cpu")
    pipeline = translator.engine.pipeline
    assert pipeline.src_vocab.tokens[4:] == [t for t in load_vocab(directory / "vocab.yml") if t not in
                                             ("</s>", "<unk>")]  # both read the vocabulary alike
    lines = multi30k_lines(200, split="val")
    sources = [pipeline.src_vocab.decode(pipeline.source_ids(line, k)) for k, line in enumerate(lines)]
    results = ctranslate2.Translator(str(tmp_path / "ct2")).translate_batch(sources, beam_size=1,
                                                                           max_decoding_length=12)
    _, found = translator.engine.search(lines, translator.search_config(beam=1, max_len_a=0, max_len_b=12))
    ours = [pipeline.tgt_vocab.decode(hyps[0].tokens) for hyps in found]
    assert ours == [r.hypotheses[0] for r in results]
    assert len({tuple(row) for row in ours}) > len(lines) // 10  # translations that differ from line to line
    for name in ("source.spm", "target.spm"):  # as the converter's --copy_files would put them
        shutil.copy(directory / name, tmp_path / "ct2" / name)
    import_model(tmp_path / "ct2", tmp_path / "from-ct2.pt", options=ImportConfig("en", "mg"))  # and back again
    again = Translator.load(tmp_path / "from-ct2.pt", device="cpu")
    _, found = again.engine.search(lines, again.search_config(beam=1, max_len_a=0, max_len_b=12))
    assert [again.engine.pipeline.tgt_vocab.decode(hyps[0].tokens) for hyps in found] == ours


@pytest.mark.slow
def test_decoder_yml_gives_the_search(tmp_path):
    directory = marian_release(tmp_path / "release")
    import_model(directory, tmp_path / "imported.pt")
    search = Translator.load(tmp_path / "imported.pt").config.search
    assert (search.beam, search.lenpen, search.lenpen_form, search.stopping) == (6, 0.6, "length", "early")
    about = json.loads(cli("info", "-m", tmp_path / "imported.pt", "--json").output)
    assert about["origin"] == "Marian (model.npz)" and about["vocabulary"] == "54,689 shared"


@pytest.mark.parametrize("change, message", [
    ({"transformer-postprocess-emb": "nd"}, "a layer norm on the embeddings"),
    ({"transformer-ffn-activation": "tanh"}, "transformer-ffn-activation 'tanh'"),
    ({"transformer-decoder-autoreg": "average-attention"}, "transformer-decoder-autoreg"),
    ({"transformer-train-position-embeddings": True}, "learned positions"),
    ({"transformer-dim-ffn": 256}, "tensor encoder_l1_ffn_W1 has shape \\[64, 128\\], its model.yml and vocabularies "
                                   "give \\[64, 256\\]"),
    ({"enc-depth": 1}, "the weights hold encoder layers \\[1, 2\\], its model.yml 1 \\(enc-depth\\)"),
])
@pytest.mark.slow
def test_what_nmt_cannot_hold_is_refused_in_one_line(tmp_path, change, message):
    """Each refusal names the release's model.npz, not the output."""
    directory = marian_release(tmp_path / "release", **change)
    with pytest.raises(NmtError, match=f"^{re.escape(str(directory / 'model.npz'))}: .*{message}"):
        import_model(directory, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def declaring(path, name, shape):
    """model.npz with entry `name` (replaced or added) declaring `shape` in float32, its data absent."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path) as old:
        kept = {info.filename: old.read(info) for info in old.infolist() if info.filename != f"{name}.npy"}
    with zipfile.ZipFile(path, "w") as new:
        for member, data in kept.items():
            new.writestr(member, data)
        new.writestr(f"{name}.npy", header.getvalue())


@pytest.mark.slow
def test_model_npz_is_read_entry_by_entry_within_the_models_shapes(tmp_path):
    """An entry no model reads is never read (here one declaring 32 GB); one it reads is checked by
    its header before anything is allocated; a file cut short is one line; so is a search setting
    of decoder.yml of the wrong type."""
    release = marian_release(tmp_path / "release")
    settings = (release / "decoder.yml").read_text()
    (release / "decoder.yml").write_text(settings.replace("beam-size: 6", "beam-size: 4.5"))
    with pytest.raises(NmtError, match=f"^{release / 'decoder.yml'}: beam-size 4.5: expected an integer of at least "
                                       "1$"):
        import_model(release, tmp_path / "out.pt")
    (release / "decoder.yml").write_text(settings)
    declaring(release / "model.npz", "junk", (1 << 33,))
    import_model(release, tmp_path / "ok.pt")
    declaring(release / "model.npz", "Wemb", (1 << 22, 1 << 11))
    with pytest.raises(NmtError, match=f"^{release / 'model.npz'}: tensor Wemb has shape \\[4194304, 2048\\], its "
                                       "model.yml and vocabularies give \\[54687, 64\\]$"):
        import_model(release, tmp_path / "out.pt")
    (release / "model.npz").write_bytes((release / "model.npz").read_bytes()[:100_000])
    with pytest.raises(NmtError, match=f"^{release / 'model.npz'}: not a readable Marian model \\(File is not a zip"):
        import_model(release, tmp_path / "out.pt")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ok.pt", "release"]
