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
