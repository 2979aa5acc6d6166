"""docs/deploy.md carries one example's dry run as `decide deploy deploy/runs/<target>.toml --dry-run`
prints it (with the script written under /tmp), names the dry-run command of every example run file,
and its prices are the rows of eval/data/prices.toml.

Regenerate the dry run after changing a run file, the template or a command builder:
    PYTHONPATH=$PWD python -m tests.deploy.test_docs
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from deploy.launch import format_plan, plan
from deploy.runfile import load_run
from tests.deploy.run_files import EXAMPLES, ROOT

DOC = ROOT / "docs" / "deploy.md"
SHOWN = "deploy/runs/v6e.toml"
BLOCK = re.compile(
    r"(<!-- dry-run: (?P<path>\S+) -->\n```sh\n)(?P<body>.*?)(```\n<!-- end dry-run -->)", re.DOTALL
)


def dry_run(path: str) -> str:
    """What the dry run prints on a machine whose temporary directory is /tmp."""
    return format_plan(plan(load_run(ROOT / path), directory=Path("/tmp/opendecide-deploy")))


def test_the_shown_dry_run_is_as_printed():
    blocks = {m["path"]: m["body"] for m in BLOCK.finditer(DOC.read_text())}
    # One target rendered in full: the startup script is one file for every target.
    assert list(blocks) == [SHOWN]
    assert blocks[SHOWN] == dry_run(SHOWN), (
        f"{SHOWN}: regenerate with `PYTHONPATH=$PWD python -m tests.deploy.test_docs`"
    )


def test_every_example_has_its_dry_run_command_in_the_doc():
    commands = set(re.findall(r"`decide deploy (\S+) --dry-run`", DOC.read_text()))
    assert commands >= {str(p.relative_to(ROOT)) for p in EXAMPLES}


def test_hourly_prices_are_the_price_rows():
    rows = {
        row["name"]: row["usd_per_hour"]
        for row in tomllib.loads((ROOT / "eval" / "data" / "prices.toml").read_text())["price"]
    }
    cited = re.findall(r"\| `([\w.-]+)` \| \$([\d.]+) \|", DOC.read_text())
    assert len(cited) >= 6
    for name, usd in cited:
        assert rows[name] == float(usd), name


def printed(path: str) -> str:
    """The real command's output: `decide deploy PATH --dry-run`, with TMPDIR=/tmp."""
    command = [sys.executable, "-c", "from opendecide.cli import app; app()", "deploy", path, "--dry-run"]
    env = {**os.environ, "TMPDIR": "/tmp", "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + printed(m["path"]) + m.group(4), text))
