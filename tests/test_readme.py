"""The README documents every command, and its fresh-machine commands match CI."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _registered_commands() -> list[str]:
    import typer.main

    from autoopt.cli import app

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_every_command_is_in_the_readme():
    readme = (REPO / "README.md").read_text()
    missing = [c for c in _registered_commands() if f"autoopt {c}" not in readme]
    assert not missing, f"commands missing from README.md: {missing}"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    m = re.search(r"python -m pytest[^\n`]*", readme)
    assert m, "README.md gives no `python -m pytest` test command"
    assert m.group(0).strip() in ci, f".ci/run does not run the README's test command {m.group(0)!r}"
