"""What the tpu-inference patch tests share: the 0.32.0 wheel from PyPI, unpacked, and the plugin installed from ``patches/``.

The wheel is cached in ``$OPENDECIDE_CACHE/wheels`` (default ``~/.cache/opendecide``) and checked by its SHA-256.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL = "tpu_inference-0.32.0-py3-none-any.whl"
WHEEL_SHA256 = "7c25a3c76cefd383f06ef115a6ed4d7bed82c081f047046bfef55f5913ea06d4"  # PyPI's file, 2026-11-29


def _cache_dir() -> Path:
    return Path(os.environ.get("OPENDECIDE_CACHE") or Path.home() / ".cache" / "opendecide") / "wheels"


@pytest.fixture(scope="session")
def tpu_inference_wheel() -> Path:
    wheel = _cache_dir() / WHEEL
    wheel.parent.mkdir(parents=True, exist_ok=True)
    # Test workers share the cache: one downloads while the others wait, none reads a half-written wheel.
    with (wheel.parent / f".{WHEEL}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not wheel.exists():
            _download(wheel.parent)
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == WHEEL_SHA256, (
        f"{wheel} is not PyPI's 0.32.0 wheel"
    )
    return wheel


def _download(folder: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "tpu-inference==0.32.0",
            "-d",
            str(folder),
        ],
        check=True,
    )


@pytest.fixture(scope="session")
def upstream_tree(tpu_inference_wheel, tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("tpu-inference-0.32.0")
    with zipfile.ZipFile(tpu_inference_wheel) as wheel:
        wheel.extractall(tree)
    return tree


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """The patches distribution built and installed from ``patches/`` into its own directory."""
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = tmp_path_factory.mktemp("plugin-source") / "patches"
    shutil.copytree(
        ROOT / "patches", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    site = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
    )
    return site
