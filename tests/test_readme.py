"""The README's commands stay true: CI runs its test command verbatim, and the main job exists."""

import re
from pathlib import Path

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
    assert len(printed) == 1 + 3 + 2 + 1 + 6  # translations, 3-best, prefix, sample, score, the file's 6 lines
