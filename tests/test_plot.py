"""Pictures: attention weights and heat maps, training curves."""

import json
import struct

import pytest
import torch
from click.testing import CliRunner
from conftest import block_import, synthetic_data_dir, tiny_checkpoint, write_lines

from nmt_cli.cli import main
from nmt_cli.config import TrainConfig
from nmt_cli.errors import NmtError
from nmt_cli.model.architecture import PRESETS
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.model.transformer import Transformer
from nmt_cli.train.run import TrainingRun


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_attention_weights_are_distributions_and_give_the_same_output():
    torch.manual_seed(0)
    config = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0)
    model = Transformer(config, 20, 20, 0, True).eval()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    tgt = torch.tensor([[1, 11, 12, 13], [1, 14, 0, 0]])
    weights = model.attention_weights(src, tgt)
    assert [len(weights[k]) for k in ("encoder", "decoder", "cross")] == [2, 2, 2]
    for per_layer in weights.values():
        for w in per_layer:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    for w in weights["decoder"]:
        assert torch.equal(w, w.tril())  # no weight on future positions
    for w in weights["encoder"] + weights["cross"]:
        assert (w[1, :, :, 3:] == 0).all()  # no weight on source padding
    # The kept weights are the ones the model uses: the explicit path gives SDPA's output.
    for module in model.modules():
        if hasattr(module, "keep_weights"):
            module.keep_weights = True
    explicit = model(src, tgt)
    for module in model.modules():
        if hasattr(module, "keep_weights"):
            module.keep_weights = False
    torch.testing.assert_close(explicit, model(src, tgt), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_translate_writes_heat_maps_of_the_models_weights(tmp_path, monkeypatch):
    import matplotlib.axes

    model = tiny_checkpoint(tmp_path / "m.pt", seed=4)
    write_lines(tmp_path / "in.txt", ["a b c", "", "d e"])
    shown = []
    real_imshow = matplotlib.axes.Axes.imshow
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", lambda ax, data, **kw: shown.append(data) or
                        real_imshow(ax, data, **kw))
    result = CliRunner().invoke(main, ["translate", "-m", str(model), "-i", str(tmp_path / "in.txt"), "-o",
                                       str(tmp_path / "out.txt"), "--attention-plot", str(tmp_path / "att")])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "att").iterdir())
    assert files == [f"line00000{n}.{k}.layer1.png" for n in (1, 3) for k in ("cross", "decoder", "encoder")]
    # 3 panels (2 heads + mean), each max(2.5, 0.28 x tokens) inches, plus 1 inch, at 100 dpi.
    translation = (tmp_path / "out.txt").read_text().splitlines()[0]
    tokens = max(4, len(translation.split()) + 1)
    assert png_size(tmp_path / "att/line000001.cross.layer1.png")[0] == round(100 * (3 * max(2.5, 0.28 * tokens) + 1))
    # The first picture is line 1's encoder self-attention: its panels are the model's weights.
    bundle = load_bundle(model)
    src = torch.tensor([bundle.src_vocab.encode("a b c".split()) + [2]])
    tgt = torch.tensor([[1] + bundle.tgt_vocab.encode(translation.split())])
    encoder = bundle.model.attention_weights(src, tgt)["encoder"][0][0]
    torch.testing.assert_close(torch.as_tensor(shown[0]), encoder[0])
    torch.testing.assert_close(torch.as_tensor(shown[2]), encoder.mean(0))


@pytest.mark.slow
def test_layers_and_heads_selection(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    write_lines(tmp_path / "in.txt", ["a b"])
    args = ["translate", "-m", str(model), "-i", str(tmp_path / "in.txt"), "--attention-plot"]
    assert CliRunner().invoke(main, args + [str(tmp_path / "all")]).exit_code == 0
    assert CliRunner().invoke(main, args + [str(tmp_path / "a"), "--layers", "1", "--heads", "2"]).exit_code == 0
    full = png_size(tmp_path / "all/line000001.cross.layer1.png")[0]
    chosen = png_size(tmp_path / "a/line000001.cross.layer1.png")[0]
    assert (full - 100) * 2 == (chosen - 100) * 3  # 3 panels (2 heads + mean) against 2 (head 2 + mean)
    args.append(str(tmp_path / "b"))
    result = CliRunner().invoke(main, args + ["--layers", "3"])
    assert result.exit_code == 1 and "--layers 3: the model has 1 layers" in result.output


def test_a_plot_directory_that_cannot_be_written_is_refused_before_translating(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(main, ["translate", "-m", str(model), "-o", str(tmp_path / "out.txt"),
                                       "--attention-plot", str(tmp_path / "file/att")], input="a b\n")
    assert result.exit_code == 1 and not (tmp_path / "out.txt").exists()
    assert result.output.strip() == f"Error: --attention-plot {tmp_path}/file/att: cannot write the plots there " \
                                    "(Not a directory)"


def test_jsonl_carries_cross_attention(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt", seed=2)
    result = CliRunner().invoke(main, ["translate", "-m", str(model), "--format", "jsonl", "--attention"],
                                input="a b c d\n")
    record = json.loads(result.output)
    attention = record["attention"]
    assert attention["src_tokens"] == ["a", "b", "c", "d", "</s>"] and attention["layer"] == 1
    assert attention["tgt_tokens"] == record["nbest"][0]["tokens"] + ["</s>"]
    assert len(attention["weights"]) == len(attention["tgt_tokens"])
    assert all(len(row) == 5 and abs(sum(row) - 1) < 1e-3 for row in attention["weights"])


def test_training_curves_of_two_runs(tmp_path):
    data = synthetic_data_dir(tmp_path)
    model = PRESETS["small"].replace(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, heads=2)
    for name in ("a", "b"):
        config = TrainConfig(max_updates=6, max_tokens=200, log_interval=2, validate_interval_updates=3,
                             eval_bleu=name == "b", eval_bleu_beam=1)
        TrainingRun(data, tmp_path / name, model, config, progress_bar=False).run()
    result = CliRunner().invoke(main, ["plot", "curves", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                                       str(tmp_path / "curves.png")])
    assert result.exit_code == 0, result.output
    assert png_size(tmp_path / "curves.png") == (1100, 960)  # 3 rows (loss, ppl, bleu) x 2 columns


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    from nmt_cli.plot import pyplot

    block_import(monkeypatch, "matplotlib")
    with pytest.raises(NmtError, match=r"pip install 'nmt-cli\[plot\]'"):
        pyplot()
    result = CliRunner().invoke(main, ["plot", "curves", str(tmp_path)])
    assert result.exit_code == 1 and "matplotlib" in result.output
