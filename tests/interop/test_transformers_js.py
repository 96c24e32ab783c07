"""The JavaScript route of `nmt export --format onnx`: transformers.js in Node
(`pipeline('translation')`, local files only) translates the export of a trained SentencePiece
model as `nmt translate --beam 1` does, and its int8 graphs (dtype q8) mostly as the float32 ones;
a model whose text JavaScript cannot tokenize is exported for onnxruntime alone, with a one-line
note that says why and what to train instead."""

import pytest
from conftest import cli, run_transformers_js, tiny_checkpoint

pytest.importorskip("onnxscript")

LIMIT = 20  # output tokens: `nmt translate --max-len-b` and transformers.js's max_new_tokens (its forced </s> one more)


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["shared"], indirect=True)
def test_transformers_js_translates_as_nmt_does(exported, transformers_js, tmp_path):
    tmp, _, sources = exported
    model = tmp / "ck/checkpoint_last.pt"
    result = cli("export", "-m", model, "--format", "onnx", "--quantize", "int8", "-o", tmp_path / "onnx")
    assert result.exit_code == 0 and "note" not in result.output, result.output
    found = run_transformers_js(transformers_js, tmp_path / "onnx", sources, max_new_tokens=LIMIT + 1)
    result = cli("translate", "-m", model, "--beam", 1, "--max-len-a", 0, "--max-len-b", LIMIT, "--at-limit", "free",
                 input="\n".join(sources) + "\n")
    assert result.exit_code == 0, result.output
    assert found["translations"] == result.stdout.splitlines()
    int8 = run_transformers_js(transformers_js, tmp_path / "onnx", sources, dtype="q8", max_new_tokens=LIMIT + 1)
    same = sum(a == b for a, b in zip(int8["translations"], found["translations"]))
    assert same >= 3 * len(sources) // 4  # int8 is lossy, yet mostly the same (37 of 40 when written)


def test_a_model_of_words_exports_for_onnxruntime_with_a_note(tmp_path, monkeypatch):
    from nmt_cli.interop import export_onnx

    monkeypatch.setattr(export_onnx, "export_graphs", lambda model, out: None)  # the graphs: tests above
    result = cli("export", "-m", tiny_checkpoint(tmp_path / "words.pt"), "--format", "onnx", "-o", tmp_path / "onnx")
    assert result.exit_code == 0, result.output
    (note,) = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert "not transformers.js" in note and "--subword sentencepiece" in note
    assert not (tmp_path / "onnx/tokenizer.json").exists() and (tmp_path / "onnx/nmt-cli.json").exists()
