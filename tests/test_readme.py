"""The README's commands are the ones CI runs, so they stay true."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_commands():
    readme = ROOT.joinpath("README.md").read_text()
    ci = [line for line in ROOT.joinpath(".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    for command in ("pip install torch==2.13.0", "python -m pytest"):
        line = next(line for line in ci if command in line)
        assert f"\n{line}\n" in readme, line
