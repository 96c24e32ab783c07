"""The benchmark scripts still run and print their JSON (tiny settings; no speed is checked here).

The README's Performance figures come from these scripts, so a change to the library that breaks
one should fail here, not on the next person who measures. The side-by-sides with fairseq need
it installed: not run here; CTranslate2 is in the dev extra (for `nmt export`), so its runs.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NEEDS_CTRANSLATE2, synthetic_data_dir, tiny_checkpoint, tiny_sentencepiece_checkpoint, write_lines

BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"


def saved_whole_shortlist(model: Path, path: Path) -> Path:
    """A shortlist of the checkpoint's whole target vocabulary (its outputs unchanged), saved at `path`."""
    from builders import whole_shortlist

    from nmt_cli.model.checkpoint import load_bundle

    bundle = load_bundle(model)
    whole_shortlist(bundle.src_vocab.tokens, bundle.tgt_vocab.tokens).save(path)
    return path


def run(script: str, *args: object) -> list[dict]:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *map(str, args)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_train_speed(tmp_path):
    data = synthetic_data_dir(tmp_path)
    (plain,) = run("train_speed.py", data, "--max-tokens", 200, "--warmup", 1, "--updates", 2, "--threads", 1)
    assert plain["benchmark"] == "train_speed" and plain["target_tokens_per_s"] > 0 and plain["peak_rss_mb"] > 0
    (ab,) = run("train_speed.py", data, "--max-tokens", 200, "--warmup", 1, "--updates", 2, "--threads", 1,
                "--dropout-ab")
    assert all(ab[f"target_tokens_per_s_{kind}"] > 0 for kind in ("ours", "torch", "none"))


@pytest.mark.slow
def test_decode_speed(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    (result,) = run("decode_speed.py", "-m", model, "-i", source, "--ref", source, "--threads", 1,
                    "--profile", tmp_path / "profile.txt", "--steps-between-reads", 3, "--quantize", "int8",
                    "--shortlist", saved_whole_shortlist(model, tmp_path / "whole.txt"))
    assert result["steps_between_reads"] == 3 and result["quantize"] == "int8"
    assert result["shortlist"] == str(tmp_path / "whole.txt")
    assert result["sentences"] == 3 and result["target_tokens_per_s"] > 0 and 0 <= result["bleu"] <= 100
    profile = (tmp_path / "profile.txt").read_text()
    assert result["device_busy"] is None and "aten::" in profile and "Input Shapes" in profile


@pytest.mark.slow
def test_mbr_gain(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    beam, *runs = run("mbr_gain.py", "-m", model, "-i", source, "--ref", source, "--mbr", 2, 3, "--utility", "bleu",
                      "--candidates", "beam", "sample", "--threads", 1)
    assert beam["run"] == "beam" and [(r["mbr"], r["mbr_candidates"]) for r in runs] == [
        (2, "beam"), (2, "sample"), (3, "beam"), (3, "sample")]
    assert all(0 <= r["bleu"] <= 100 and 0 <= r["chrf"] <= 100 and r["seconds"] > 0 for r in [beam, *runs])


@pytest.mark.slow
def test_graph_check(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    (result,) = run("graph_check.py", "-m", model, "-i", source, "--ref", source, "--threads", 1, "--replayed")
    assert result["same_lines"] == 3 and result["bleu"] == result["graph_bleu"]
    assert result["decoders"] == [[4, 4, 16, 64]]  # 3 sentences in 4 slots, beam 4, 16 keys, 64 positions
    assert result["operations_per_step"]["decoder"] > 0 and result["operations_per_step"]["rest"] > 0


@pytest.mark.slow
def test_gpu_speed_runs_its_code_path_on_the_cpu():
    # A CPU-sized peak (1 TFLOP/s): against the default H100 peak, the CPU's MFU rounds to 0.0 in a slow run.
    result, plain, ratio = run("gpu_speed.py", "--device", "cpu", "--precision", "fp32", "--arch", "small",
                               "--vocab", 200, "--max-tokens", 300, "--warmup", 1, "--updates", 2, "--peak-tflops", 1,
                               "--baseline")
    assert result["device"] == "cpu" and result["target_tokens_per_s"] > 0 and 0 < result["mfu_matmul"] < 1
    assert result["host_waits_per_update"] is None  # counted on a GPU only
    assert plain["model"] == "torch.nn.Transformer" and plain["target_tokens_per_s"] > 0
    assert ratio["speedup_over_torch_nn_transformer"] > 0


@pytest.mark.slow
def test_attention_speed():
    results = run("attention_speed.py", "--rounds", 1, "--repeat", 1, "--threads", 1)
    assert results and all(r["fused_ms"][0] > 0 and r["written_out_ms"][0] > 0 for r in results)


@pytest.mark.slow
def test_loss_speed():
    results = run("loss_speed.py", "--tokens", 300, "--vocab", 1000, "--rounds", 1, "--repeat", 1, "--threads", 1)
    assert [r["way"] for r in results] == ["definition", "blocks"]  # the fused one needs a CUDA GPU
    assert all(r["ms"] > 0 for r in results) and results[1]["loss_rel_diff"] < 1e-5


@pytest.mark.slow
def test_preprocess_speed(multi30k):
    *runs, speedup = run("preprocess_speed.py", "--lines", 300, "--bpe-merges", 200, "--rounds", 2)
    assert [r["workers"] for r in runs] == [1, 2, 1, 2] and all(r["train_pairs"] == 300 for r in runs)
    assert len(speedup["per_round"]["bpe_binarize"]) == 2


@pytest.mark.slow
def test_matmul_speed():
    results = run("matmul_speed.py", "--scale", 0.25, "--seconds", 0.05, "--rounds", 1)
    assert len(results) == 4 and all(r["gflops_1_thread"] > 0 and r["gflops_2_threads"] > 0 for r in results)
    assert all(r["gflops_slowest_of_2_processes_at_once"] > 0 for r in results)


@pytest.mark.slow
def test_learning_margin():
    (result,) = run("learning_margin.py", "--paths", "avx2", "--max-updates", 60)
    assert result["path"] == "avx2" and all(0 <= result[k][0] <= 1 for k in ("best_fp32", "best_int8", "last_fp32"))


@pytest.mark.slow
def test_resume_paths():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "resume_paths.py"), "--updates", "10"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0].endswith("bit-identical")  # the same path: resume is exact


@pytest.mark.slow
def test_serve_load(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    levels = run("serve_load.py", "-m", model, "-i", source, "--clients", 1, 3, "--requests", 6, "--threads", 1)
    assert [level["clients"] for level in levels] == [1, 3]
    assert all(level["sentences_per_s"] > 0 and level["p99_ms"] >= level["p50_ms"] > 0 for level in levels)


@pytest.mark.slow
def test_serve_fairness(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"] * 20)
    (result,) = run("serve_fairness.py", "-m", model, "-i", source, "--large", 40, "--max-tokens", 30, "--delay", 0,
                    "--repeats", 1, "--threads", 1)
    assert result["searches_per_large_request"] >= 4  # 40 sentences, a search holding 6 of the longest
    assert result["small_alone_ms"] > 0 and result["small_behind_large_ms_worst"] > 0 and result["large_ms_median"] > 0


@pytest.mark.slow
def test_onnx_decode_speed(tmp_path):
    pytest.importorskip("onnxscript")
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    ours, theirs = run("onnx_decode_speed.py", "-m", model, "-i", source, "--ref", source, "--threads", 1, "--int8")
    assert (ours["engine"], theirs["engine"]) == ("nmt-cli", "onnxruntime") and theirs["sentences"] == 3
    assert theirs["int8"] is True
    assert theirs["folder_mb"] > theirs["transformers_js_loads_mb"] > 0 and 0 <= theirs["lines_equal_to_nmt"] <= 3


@pytest.mark.slow
def test_web_page_speed(tmp_path, transformers_js):
    pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the dev extra has it)")
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    model = tiny_sentencepiece_checkpoint(tmp_path / "pieces.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "D E"])
    (result,) = run("web_page_speed.py", "-m", model, "--transformers-js", transformers_js.parents[1], "-i", source,
                    "--ref", source, "--lines", 2)
    assert result["lines"] == 2 and result["first_translation_s"] > result["load_s"] > 0
    assert result["sentences_per_s"] > 0 and 0 <= result["lines_equal_to_nmt"] <= 2


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_ctranslate2_decode_speed(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    (result,) = run("ctranslate2_decode_speed.py", "-m", model, "-i", source, "--ref", source, "--threads", 1)
    assert result["sentences"] == 3 and result["max_token_logprob_difference"] < 1e-4
    (listed,) = run("ctranslate2_decode_speed.py", "-m", model, "-i", source, "--ref", source, "--threads", 1,
                    "--compute-type", "int8", "--shortlist", saved_whole_shortlist(model, tmp_path / "whole.txt"))
    assert listed["shortlist"] == str(tmp_path / "whole.txt") and listed["sentences_per_s"] > 0


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_transformers_export(tmp_path):
    model = tiny_sentencepiece_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    (result,) = run("transformers_export.py", "-m", model, "-i", source, "--ref", source, "--threads", 1,
                    "--ct2-converter")
    assert result["sentences"] == 3 and result["max_logit_difference"] < 1e-4
    assert result["greedy"]["same_lines"] == 3 and 0 <= result["beam_lenpen"]["bleu_transformers"] <= 100
    assert "vocabulary" in result["ct2_transformers_converter"]  # OPUS-MT's layout expected: refused


@pytest.mark.slow
def test_import_speed(tmp_path, multi30k):
    (result,) = run("import_speed.py", "--work", tmp_path, "--scale", 0.0625, "--lines", 4, "--repeats", 1,
                    "--threads", 1)
    assert result["import_s"] > 0 and result["import_peak_rss_mb"] > result["runtime_rss_mb"] > 0
    assert result["imported_target_tokens_per_s"] > 0 and result["native_target_tokens_per_s"] > 0


@pytest.mark.slow
def test_import_exactness(tmp_path, multi30k):
    (result,) = run("import_exactness.py", "--work", tmp_path / "w", "--lines", 20, "--beam-lines", 10,
                    "--updates", 40)
    for layout in ("en-mg", "tc-big-like"):
        assert result[layout]["ids_equal"] == result[layout]["greedy_equal"] == 20
        assert result[layout]["max_logit_difference"] < 1e-4
    assert result["beam_lines"] == result["beam_equal"] == 10


@pytest.mark.slow
def test_translate_startup(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    (result,) = run("translate_startup.py", "-m", model, "-i", source, "--lines", 2, "--rounds", 1)
    assert result["lines"] == 2 and len(result["seconds"]) == 1 and result["median_s"] > 0
    assert list(result["stages_s"]) == ["import_torch", "import_nmt_cli", "select_device", "load_checkpoint",
                                        "build_translator", "translate"]
    assert result["stages_s"]["import_torch"] > 0  # measured in a process that had not imported it yet
    (untrained,) = run("translate_startup.py", "-m", model, "-i", source, "--lines", 1, "--rounds", 1,
                       "--arch", "small")
    assert untrained["model"] == "small" and untrained["stages_s"]["load_checkpoint"] > 0


@pytest.mark.slow
def test_host_overhead_runs_an_update_and_search_steps_on_the_meta_device():
    """An update's operators on meta, and a search step's, eager and with --cuda-graphs: the graphs
    leave only the search's bookkeeping to the host (no decoder layer), and the host reads every
    8th step."""
    update, eager, graphs = run("host_overhead.py", "--arch", "small", "--vocab", 200, "--max-tokens", 300,
                                "--updates", 2, "--clip-norm", 1.0, "--search-arch", "small", "--sentences", 2,
                                "--source-length", 5, "--repeats", 1)
    assert update["host_ms_per_update"] > 0 and update["operators_per_update"] > 100
    assert 0 < sum(update["top_operators"].values()) < update["operators_per_update"]
    outside = update["outside_by_name"]  # the optimizer and clipping stay outside what --compile compiles
    assert 0 < sum(outside.values()) == update["operators_outside_compiled"] < update["operators_per_update"] / 10
    assert "aten._fused_adam_" in outside and "aten._foreach_norm" in outside
    assert not {"aten.mm", "aten.addmm", "aten.logsumexp"} & outside.keys()  # the model and its loss inside
    assert not eager["cuda_graphs"] and graphs["cuda_graphs"]
    assert eager["reads_per_step"] == graphs["reads_per_step"] == 0.125
    assert 0 < graphs["operators_per_step"] < eager["operators_per_step"] / 2
    assert "aten.layer_norm" in eager["top_operators_per_step"]
    assert "aten.layer_norm" not in graphs["top_operators_per_step"] and "aten.topk" in graphs["top_operators_per_step"]


def test_gpu_summary_reads_what_the_stages_wrote(tmp_path):
    def jsonl(name, *rows):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    (tmp_path / "device.txt").write_text("NVIDIA H100 80GB HBM3, 81559 MiB, 550.54\ntorch 2.13.0+cu128\n")
    ours = {"model": "nmt-cli", "arch": "big", "compile": False, "target_tokens_per_s": 150000.0, "mfu_6nd": 0.2}
    jsonl("gpu_speed.jsonl", ours, {**ours, "compile": True, "target_tokens_per_s": 250000.0, "mfu_6nd": 0.33},
          {"model": "torch.nn.Transformer", "arch": "big", "compile": True, "target_tokens_per_s": 140000.0},
          {"arch": "big", "compile": True, "speedup_over_torch_nn_transformer": 1.8})
    decode = {"model": "/tmp/w/small/checkpoint_last.pt", "device": "cuda", "cuda_graphs": False,
              "steps_between_reads": 8}
    jsonl("decode_speed.jsonl", {**decode, "dtype": "float32", "target_tokens_per_s": 30000.0, "bleu": 36.4},
          {**decode, "dtype": "bfloat16", "target_tokens_per_s": 39000.0},
          {**decode, "dtype": "bfloat16", "cuda_graphs": True, "target_tokens_per_s": 50000.0})
    jsonl("translate_startup.jsonl", {"device": "cuda", "cuda_graphs": False, "median_s": 2.5},
          {"device": "cpu", "cuda_graphs": False, "median_s": 3.1})
    (tmp_path / "pytest.txt").write_text("FAILED tests/test_gpu.py::test_x\n1 failed, 520 passed in 300s\n")
    subprocess.run([sys.executable, str(BENCHMARKS / "gpu_summary.py"), tmp_path], check=True, capture_output=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["device"].startswith("NVIDIA H100") and summary["torch"] == "2.13.0+cu128"
    assert (summary["big_tok_s"], summary["mfu_big"], summary["big_run"]) == (250000.0, 0.33, "compiled")
    assert summary["base_tok_s"] is None and summary["mfu_base"] is None  # not measured: null, never a guess
    assert summary["anchor_big_compiled_tok_s"] == 140000.0
    assert summary["decode_small_tok_s"] == 50000.0 and summary["decode_small_run"]["cuda_graphs"]
    assert summary["decode_bf16_over_fp32"] == 1.3 and summary["decode_base_tok_s"] is None
    assert summary["translate_100_lines_s"] == 2.5
    assert (summary["pytest_failed"], summary["pytest_finished"]) == (1, True)
    assert summary["decode_small_bleu"] == 36.4 and summary["quickstart_10min_bleu"] is None
    # a run cut off at its time limit: the failures written so far (failures.txt, else FAILED lines)
    (tmp_path / "pytest.txt").write_text("[gw1] [ 24%] FAILED tests/test_a.py::test_x[a b]\n"
                                         "[gw2] [ 30%] FAILED tests/test_b.py::test_y\n....F\n")
    (tmp_path / "quickstart.txt").write_text("BLEU = 40.12 70.1/48.0/34.9/25.6 (BP = 1.000 ...) nrefs:1\n")
    subprocess.run([sys.executable, str(BENCHMARKS / "gpu_summary.py"), tmp_path], check=True, capture_output=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["pytest_failed"], summary["pytest_finished"], summary["quickstart_10min_bleu"]) == (2, False, 40.12)
    (tmp_path / "failures.txt").write_text("=== tests/test_a.py::test_x (call)\nE  assert 1 == 2\n\n"
                                           "=== tests/test_a.py::test_x (teardown)\nE  oops\n\n")
    subprocess.run([sys.executable, str(BENCHMARKS / "gpu_summary.py"), tmp_path], check=True, capture_output=True)
    assert json.loads((tmp_path / "summary.json").read_text())["pytest_failed"] == 1


@pytest.mark.slow
def test_shortlist_speed(tmp_path):
    from builders import run_training

    data = synthetic_data_dir(tmp_path, n_train=60, n_valid=5)
    run_training(data, tmp_path / "ck", max_updates=2).run()
    source = write_lines(tmp_path / "in.src", ["a b c", "d e f g", "h"])
    plain, again, *listed = run("shortlist_speed.py", "-m", tmp_path / "ck/checkpoint_last.pt", "-d", data, "-i",
                                source, "--ref", source, "--best", 2, "--first", 3, "--threads", 1)
    assert plain["run"] == "plain" and again["run"] == "plain again" and plain["lines"] == 3
    assert [r["run"] for r in listed] == ["ibm1 first 3 best 2", "dice first 3 best 2"]
    assert all(r["speed_up"] > 0 and 0 <= r["bleu"] <= 100 and r["columns_of_64_lines"] > 4 for r in listed)
    *_, paired = run("shortlist_speed.py", "-m", tmp_path / "ck/checkpoint_last.pt", "-d", data, "-i", source, "--ref",
                     source, "--best", 2, "--first", 3, "--threads", 1, "--methods", "ibm1", "--rounds", 2)
    assert len(paired["plain_lines_per_s"]) == len(paired["listed_lines_per_s"]) == 2 and paired["paired_speed_up"] > 0
    from nmt_cli.decode.shortlist import make

    made = tmp_path / "made.txt"
    make(data, 3, 1).save(made)
    *_, given = run("shortlist_speed.py", "-m", tmp_path / "ck/checkpoint_last.pt", "--files", made, "-i", source,
                    "--ref", source, "--threads", 1, "--rounds", 2)
    assert given["run"] == str(made) and "learn_s" not in given and len(given["listed_lines_per_s"]) == 2
    assert given["columns_of_64_lines"] < listed[0]["columns_of_64_lines"]  # best 1, not 2: the file's own


def test_shortlist_speed_needs_shortlists_to_measure(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "shortlist_speed.py"), "-m", tmp_path / "none.pt"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "give -d DATA_DIR (shortlists to learn) or --files" in done.stderr


@pytest.mark.parametrize("has_avx512, aten, onednn", [(True, "avx512", "AVX512_CORE"), (False, "avx2", "AVX2")])
def test_the_avx512_kernel_path_is_forced_only_on_a_cpu_that_has_it(monkeypatch, has_avx512, aten, onednn):
    """Forced on a CPU without AVX-512, PyTorch's avx512 kernels die of SIGILL: the benchmarks take avx2 there."""
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import kernel_environment

    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: has_avx512, raising=False)
    environment = kernel_environment("avx512")
    assert (environment["ATEN_CPU_CAPABILITY"], environment["ONEDNN_MAX_CPU_ISA"]) == (aten, onednn)
    assert kernel_environment("default")["ATEN_CPU_CAPABILITY"] == "default"


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_argos_parity(tmp_path, argos_python):
    model = tiny_sentencepiece_checkpoint(tmp_path / "m.pt", max_positions=300)
    lines = write_lines(tmp_path / "in.src", ["a b c", "d e f g. h i", "j"])
    results = run("argos_parity.py", "-m", model, "--sentences", lines, "--argos-python", argos_python, "-i", lines,
                  "--ref", lines)
    assert [r["package"] for r in results] == ["float32", "int8", "nmt"]
    assert results[0]["lines"] == 3 and 0 <= results[0]["equal_to_nmt"] <= 3 and results[2]["nmt_bleu"] >= 0
