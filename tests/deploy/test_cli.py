"""``decide deploy``: the dry run prints the plan; a real run writes the script and runs the steps through
the installed gcloud, streaming its output and stopping at the first failure."""

from __future__ import annotations

import shutil
import tempfile
import tomllib

import pytest
from typer.testing import CliRunner

from deploy.launch import format_plan, plan
from opendecide.cli import app

from .conftest import EXAMPLES, PLACEHOLDER_PROJECT, ROOT, example


def test_dry_run_prints_the_plan(example_name):
    path = ROOT / "deploy" / "runs" / f"{example_name}.toml"
    result = CliRunner().invoke(app, ["deploy", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout == format_plan(plan(example(example_name)))
    assert "# --- startup script: " in result.stdout and result.stdout.rstrip().endswith("# --- end of startup script ---")


def test_a_bad_run_file_names_the_field(tmp_path):
    data = (ROOT / "deploy" / "runs" / "v5e.toml").read_text().replace('provisioning = "flex-start"', 'provisioning = "spot"')
    path = tmp_path / "run.toml"
    path.write_text(data)
    result = CliRunner().invoke(app, ["deploy", str(path), "--dry-run"])
    assert result.exit_code == 2 and "provisioning: one of flex-start, got 'spot'" in result.output


def test_a_real_run_refuses_the_placeholder_service_digest():
    result = CliRunner().invoke(app, ["deploy", str(EXAMPLES[0])])
    assert result.exit_code == 1 and "placeholder digest" in result.output


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
def test_a_real_run_streams_gcloud_and_stops_at_the_first_failure(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("CLOUDSDK_CORE_DISABLE_PROMPTS", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    text = (ROOT / "deploy" / "runs" / "v6e.toml").read_text()
    text = text.replace('"your-project"', f'"{PLACEHOLDER_PROJECT}"').replace("0" * 64, "ab" * 32)
    run_file = tmp_path / "v6e.toml"
    run_file.write_text(text)
    result = CliRunner().invoke(app, ["deploy", str(run_file)])
    streamed = capfd.readouterr()
    assert result.exit_code == 1
    assert "step 1 (the Hugging Face token secret 'hf-token' exists) failed with exit status 1" in result.output
    assert "You do not currently have an active account selected" in streamed.err  # gcloud's own output
    assert "gcloud compute instances create" not in result.output  # nothing created after a failed preflight
    name = tomllib.loads(text)["name"]
    assert (tmp_path / "opendecide-deploy" / f"{name}.startup.sh").read_text().startswith("#!/usr/bin/env bash")
