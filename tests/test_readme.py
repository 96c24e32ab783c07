"""The README's commands stay true: CI runs its test command verbatim, and the main job exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = ROOT.joinpath("README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_ci_runs_the_readme_test_command():
    main_job, tests = readme_commands()
    assert tests.endswith("python -m pytest") and "pip install torch==2.13.0" in tests
    assert tests in ROOT.joinpath(".ci/run").read_text().splitlines()


def test_main_job_shares_the_setup_and_runs_the_quickstart():
    main_job, tests = readme_commands()
    setup = tests.removesuffix(" && python -m pytest")
    assert main_job == setup + " && bash data/quickstart.sh"
    assert ROOT.joinpath("data/quickstart.sh").is_file()


def test_the_python_api_examples_run(tmp_path, monkeypatch, capsys):
    """The README's Python API section, run as written on a tiny model named as it names it."""
    from conftest import tiny_checkpoint, write_lines

    text = ROOT.joinpath("README.md").read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.+?)\n```", section, re.S)
    monkeypatch.chdir(tmp_path)
    tiny_checkpoint(tmp_path / "avg.pt", symbols="AaBbMmEeFfinrdT.", max_positions=16)
    write_lines(tmp_path / "test.en", ["A man rides .", "Two dogs ."] * 3)
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 + 3 + 2 + 1 + 6  # translations (a list, one str), 3-best, prefix, sample, score, 6 lines
    assert printed[0].startswith("[") and not printed[1].startswith("[")  # a list gives a list, a str a str


@pytest.mark.slow
def test_start_from_a_released_model_runs_as_written(tmp_path, monkeypatch):
    """The README's "Start from a released model" commands, in a shell, on a random-weight release
    of OPUS-MT's layout in place of the download, Multi30k slices as raw/, and 3 updates."""
    import os
    import subprocess
    import sys

    from conftest import MULTI30K, head, opus_mt_release, write_lines

    text = ROOT.joinpath("README.md").read_text()
    section = text.split("## Start from a released model", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.+?)\n```", section, re.S)
    download, *rest = commands.replace("\\\n", "").splitlines()
    assert download.startswith("huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de")
    opus_mt_release(tmp_path / "opus-mt-en-de")
    (tmp_path / "raw").mkdir()
    for split, start in (("train", 0), ("val", 1000)):
        for lang in ("en", "de"):
            write_lines(tmp_path / f"raw/{split}.{lang}", head(MULTI30K / f"train.{lang}", start + 60)[start:])
    script = "set -euo pipefail\n" + "\n".join(rest).replace("--max-updates 2000", "--max-updates 3") + "\n"
    script = script.replace("--from-model en-de.pt", "--from-model en-de.pt --max-len-ratio 4 --quiet")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "my-ckpt/checkpoint_last.pt").is_file()
    assert "en-mg" in done.stdout  # nmt info -m: the release's languages
