"""deploy/service.Dockerfile: hadolint-clean, and consistent with the startup script that runs it."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest

from deploy.startup import SERVICE_PORT, TEMPLATE
from tests.deploy.run_files import ROOT
from tests.tools import require_tool

DOCKERFILE = ROOT / "deploy" / "service.Dockerfile"


@pytest.mark.integration  # runs hadolint
def test_hadolint_clean():
    result = subprocess.run(
        [require_tool("hadolint"), str(DOCKERFILE)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration  # runs hadolint
def test_hadolint_would_catch_a_root_image(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install opendecide\nUSER root\n")
    result = subprocess.run([require_tool("hadolint"), str(bad)], check=False, capture_output=True, text=True)
    assert result.returncode != 0 and "DL3002" in result.stdout  # last USER should not be root


def test_image_matches_the_startup_script():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11[\w.-]*-slim[\w.-]*@sha256:[0-9a-f]{64}$", text, re.MULTILINE)
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    uid = re.search(r"^SERVICE_UID=(\d+)", TEMPLATE.read_text(), re.MULTILINE).group(1)
    assert users == [uid] and uid != "0"  # the script chowns the run directory to this uid
    assert re.search(rf"^EXPOSE {SERVICE_PORT}$", text, re.MULTILINE)
    assert "HEALTHCHECK" in text and f"127.0.0.1:{SERVICE_PORT}/v1/models" in text
    assert re.search(
        r'^ENTRYPOINT \["decide"\]$', text, re.MULTILINE
    )  # the script runs `IMAGE serve …` / `IMAGE eval upload …`
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
    for package in (p.rstrip("*") for p in packages):  # every package pip installs is copied in
        assert re.search(rf"^COPY {package} \./{package}$", text, re.MULTILINE), package
