"""The shipped example run files, loaded as a user's would be: what the deploy tests share (a plain module;
the ``example_name`` fixture over them is in conftest.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from deploy.runfile import Run, parse_run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy" / "runs").glob("*.toml"))
PLACEHOLDER_PROJECT = "placeholder-project"


def example(name: str, **changes) -> Run:
    """A shipped example run file, with top-level fields changed (the project, for the CLI checks)."""
    data = tomllib.loads((ROOT / "deploy" / "runs" / f"{name}.toml").read_text())
    data.update(changes)
    return parse_run(data)
