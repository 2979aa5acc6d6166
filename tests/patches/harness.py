"""Running a patch test's harness script: a fresh interpreter with the plugin's site on its path.

A plain module the patch tests import (fixtures stay in conftest.py and are used by name).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_harness(script: Path, site: Path, *args: str | Path) -> dict:
    """Run a harness script in a fresh interpreter with the plugin's site on its path; its last line is JSON."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
