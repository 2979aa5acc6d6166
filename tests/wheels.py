"""The package built and run the way a user gets it: a wheel from a copy of the tree, commands in
another venv with a clean environment (tests/test_packaging.py, tests/integration/test_base_install.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_COPIED = {".git", ".venv", "build", "dist", ".pytest_cache", ".ruff_cache", ".cache"}


def run(command: list[str], **options) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, **options)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of the tree (no stale ``build/`` can leak into it), built in ``tmp``."""
    source = tmp / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=lambda folder, names: [
            n
            for n in names
            if n == "__pycache__" or n.endswith(".egg-info") or (folder == str(ROOT) and n in NOT_COPIED)
        ],
    )
    # No build isolation: the backend (setuptools, in the test extra) comes from this venv, not from PyPI.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp / "dist"),
            str(source),
        ]
    )
    (built,) = (tmp / "dist").glob("opendecide-*.whl")
    return built


def clean_env() -> dict[str, str]:
    """This process's environment without what would point another venv's python at this one's code."""
    return {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    }
