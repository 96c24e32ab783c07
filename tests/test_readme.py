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


@pytest.mark.parametrize("page, lines", [("README.md", 2), ("docs/python-api.md", 2 + 3 + 1 + 2 + 1 + 6)])
def test_the_python_api_examples_run(tmp_path, monkeypatch, capsys, page, lines):
    """The Python API examples, run as written on a tiny model named as they name it: the README's
    (one str, then a list) and the reference page's (a list, one str, 3-best, an alignment, a
    prefix, a sample, a score, 6 lines of a file)."""
    from conftest import tiny_checkpoint, write_lines

    (example,) = re.findall(r"```python\n(.+?)\n```", ROOT.joinpath(page).read_text(), re.S)
    monkeypatch.chdir(tmp_path)
    tiny_checkpoint(tmp_path / "avg.pt", symbols="AaBbMmEeFfinrdT.", max_positions=16)
    write_lines(tmp_path / "test.en", ["A man rides .", "Two dogs ."] * 3)
    exec(compile(example, page, "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == lines
    one, many = (0, 1) if page == "README.md" else (1, 0)
    assert printed[many].startswith("[") and not printed[one].startswith("[")  # a list gives a list, a str a str


@pytest.mark.slow
def test_the_quick_tour_runs_as_written(tmp_path, multi30k):
    """The README's Quick tour, in a shell from a copy of the checkout's data/, on Multi30k cut to
    300 training pairs and 20 test lines, with 200 merges and 5 updates (a checkpoint each)."""
    import os
    import subprocess
    import sys

    from conftest import head, write_lines

    text = ROOT.joinpath("README.md").read_text()
    section = text.split("## Quick tour", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.+?)\n```", section, re.S)
    download, *rest = commands.replace("\\\n", "").splitlines()
    assert download.startswith("bash data/get_multi30k.sh raw")
    (tmp_path / "data").symlink_to(ROOT / "data")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                   "MULTI30K_DIR": str(multi30k)}
    run = {"cwd": tmp_path, "env": environment, "capture_output": True, "text": True, "timeout": 600}
    done = subprocess.run(["bash", "-c", download], **run)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, lines in (("train", 300), ("test_2016_flickr", 20)):
        for lang in ("en", "de"):
            write_lines(tmp_path / f"raw/{name}.{lang}", head(tmp_path / f"raw/{name}.{lang}", lines))
    script = "\n".join(rest).replace("--bpe-merges 8000", "--bpe-merges 200 --quiet")
    script = script.replace("--max-time 25 --save-interval-minutes 2", "--max-updates 5 --save-interval-updates 1 "
                            "--quiet --threads 2")
    assert "--max-updates 5" in script and "--bpe-merges 200" in script
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], **run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len((tmp_path / "test.hyp.de").read_text().splitlines()) == 20
    assert done.stdout.splitlines()[-1].startswith("BLEU")  # nmt score's line


@pytest.mark.slow
def test_start_from_a_released_model_runs_as_written(tmp_path, multi30k):
    """The README's "Start from a released model" commands, in a shell, on a random-weight release
    of OPUS-MT's layout in place of the download, Multi30k slices as raw/, and 3 updates."""
    import os
    import subprocess
    import sys

    from conftest import head, opus_mt_release, write_lines

    text = ROOT.joinpath("README.md").read_text()
    section = text.split("## Start from a released model", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.+?)\n```", section, re.S)
    download, *rest = commands.replace("\\\n", "").splitlines()
    assert download.startswith("huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de")
    opus_mt_release(tmp_path / "opus-mt-en-de")
    (tmp_path / "raw").mkdir()
    for split, start in (("train", 0), ("val", 1000)):
        for lang in ("en", "de"):
            write_lines(tmp_path / f"raw/{split}.{lang}", head(multi30k / f"train.{lang}", start + 60)[start:])
    script = "set -euo pipefail\n" + "\n".join(rest).replace("--max-updates 2000", "--max-updates 3") + "\n"
    script = script.replace("--from-model en-de.pt", "--from-model en-de.pt --max-len-ratio 4 --quiet")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "my-ckpt/checkpoint_last.pt").is_file()
    assert "en-mg" in done.stdout  # nmt info -m: the release's languages


def test_every_link_of_the_readme_and_the_docs_leads_to_a_file():
    for page in [ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_the_readme_is_a_front_page():
    assert len(ROOT.joinpath("README.md").read_text().splitlines()) <= 200
