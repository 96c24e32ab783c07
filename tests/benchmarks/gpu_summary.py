"""The verdict of a GPU machine in one file: `python tests/benchmarks/gpu_summary.py OUT`.

gpu_check.sh runs it after its stages. It reads what they wrote to OUT so far (device.txt,
gpu_speed.jsonl, decode_speed.jsonl, translate_startup.jsonl, pytest.txt) and writes
OUT/summary.json with the figures the GPU issue's targets are stated in. A figure that no stage
has measured yet is null, never a guess:
  - mfu_big, mfu_base, big_tok_s, base_tok_s: nmt-cli's fastest training run of the preset
    (6 x parameters x target tokens/s over the peak; eager or compiled, said in *_run);
  - anchor_big_compiled_tok_s: the compiled plain torch.nn.Transformer, big, in the same runs;
  - decode_small_tok_s, decode_base_tok_s: the fastest decoding of test_2016_flickr by a model of
    the preset (settings in *_run); decode_bf16_over_fp32: bf16 over fp32, small, without graphs;
  - translate_100_lines_s: `nmt translate` of 100 lines on the GPU, end to end (median);
  - decode_small_bleu: sacreBLEU of the decode stage's small model (TRAIN_MINUTES on the GPU), fp32;
  - quickstart_10min_bleu: sacreBLEU of data/quickstart.sh on the GPU (the quickstart stage);
  - pytest_failed: failed tests of the GPU machine's run; pytest_finished false: those failed
    before the run was cut off at its time limit (null: no run).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def fastest(runs: list[dict], key: str) -> dict | None:
    return max(runs, key=lambda run: run[key], default=None)


def arch_of(decode: dict) -> str:
    """gpu_check.sh trains each preset in a directory named after it: .../ARCH/checkpoint_last.pt."""
    return Path(decode["model"]).parent.name


def pytest_failed(out: Path) -> tuple[int | None, bool]:
    """Failed tests, and whether the run finished: from pytest's last line, else (a run cut off at
    its time limit) the distinct tests failed so far, in failures.txt or FAILED lines (-v, -rf)."""
    if not (out / "pytest.txt").exists():
        return None, False
    text = (out / "pytest.txt").read_text()
    if re.search(r"\d+ (passed|failed)", text):
        found = re.search(r"(\d+) failed", text)
        return (int(found.group(1)) if found else 0), True
    seen = (out / "failures.txt").read_text() if (out / "failures.txt").exists() else text
    return len(set(re.findall(r"^(?:=== |\S*\s*(?:\[ *\d+%\] )?FAILED )(\S+)", seen, re.MULTILINE))), False


def summary(out: Path) -> dict:
    result: dict = {}
    device = (out / "device.txt").read_text().splitlines() if (out / "device.txt").exists() else []
    result["device"] = device[0] if device else None
    result["torch"] = next((line.split()[1] for line in device if line.startswith("torch ")), None)
    speed = lines(out / "gpu_speed.jsonl")
    for arch in ("big", "base"):
        run = fastest([r for r in speed if r.get("model") == "nmt-cli" and r["arch"] == arch], "target_tokens_per_s")
        result[f"mfu_{arch}"] = run["mfu_6nd"] if run else None
        result[f"{arch}_tok_s"] = run["target_tokens_per_s"] if run else None
        result[f"{arch}_run"] = ("compiled" if run["compile"] else "eager") if run else None
    anchor = [r for r in speed if r.get("model") == "torch.nn.Transformer" and r["arch"] == "big" and r["compile"]]
    result["anchor_big_compiled_tok_s"] = anchor[-1]["target_tokens_per_s"] if anchor else None
    decode = [r for r in lines(out / "decode_speed.jsonl") if r["device"].startswith("cuda")]
    for arch in ("small", "base"):
        run = fastest([r for r in decode if arch_of(r) == arch], "target_tokens_per_s")
        result[f"decode_{arch}_tok_s"] = run["target_tokens_per_s"] if run else None
        result[f"decode_{arch}_run"] = {k: run[k] for k in ("dtype", "cuda_graphs", "steps_between_reads")} \
            if run else None
    plain = {r["dtype"]: r["target_tokens_per_s"] for r in decode if arch_of(r) == "small" and not r["cuda_graphs"]}
    result["decode_bf16_over_fp32"] = round(plain["bfloat16"] / plain["float32"], 3) \
        if {"bfloat16", "float32"} <= plain.keys() else None
    startup = [r for r in lines(out / "translate_startup.jsonl") if r["device"] == "cuda" and not r["cuda_graphs"]]
    result["translate_100_lines_s"] = startup[-1]["median_s"] if startup else None
    bleu = [r["bleu"] for r in decode
            if arch_of(r) == "small" and r["dtype"] == "float32" and not r["cuda_graphs"] and "bleu" in r]
    result["decode_small_bleu"] = bleu[-1] if bleu else None
    quickstart = (out / "quickstart.txt").read_text() if (out / "quickstart.txt").exists() else ""
    found = re.search(r"^BLEU = ([\d.]+)", quickstart, re.MULTILINE)
    result["quickstart_10min_bleu"] = float(found.group(1)) if found else None
    result["pytest_failed"], result["pytest_finished"] = pytest_failed(out)
    return result


def main() -> None:
    out = Path(sys.argv[1])
    result = summary(out)
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
