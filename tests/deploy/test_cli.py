"""``decide deploy``: the dry run prints the plan; a real run writes the script and runs the steps through
the installed gcloud, streaming its output and stopping at the first failure."""

from __future__ import annotations

import shlex
import tempfile
import tomllib

import pytest
from typer.testing import CliRunner

from deploy.launch import format_plan, plan
from deploy.targets import self_delete_command
from opendecide.cli import app
from tests.deploy.run_files import EXAMPLES, PLACEHOLDER_PROJECT, ROOT, example
from tests.tools import require_tool


def test_dry_run_prints_the_plan(example_name):
    path = ROOT / "deploy" / "runs" / f"{example_name}.toml"
    result = CliRunner().invoke(app, ["deploy", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout == format_plan(plan(example(example_name)))
    assert "# --- startup script: " in result.stdout and result.stdout.rstrip().endswith(
        "# --- end of startup script ---"
    )


def test_a_bad_run_file_names_the_field(tmp_path):
    data = (
        (ROOT / "deploy" / "runs" / "v5e.toml")
        .read_text()
        .replace('provisioning = "flex-start"', 'provisioning = "spot"')
    )
    path = tmp_path / "run.toml"
    path.write_text(data)
    result = CliRunner().invoke(app, ["deploy", str(path), "--dry-run"])
    assert result.exit_code == 2 and "provisioning: one of flex-start, got 'spot'" in result.output


def test_a_real_run_refuses_the_placeholder_service_digest():
    result = CliRunner().invoke(app, ["deploy", str(EXAMPLES[0])])
    assert result.exit_code == 1 and "placeholder digest" in result.output


@pytest.mark.integration  # the run's steps start the gcloud CLI
def test_a_real_run_streams_gcloud_and_stops_at_the_first_failure(tmp_path, monkeypatch, capfd):
    require_tool("gcloud")  # the run calls it by name, from PATH
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
    assert (
        "step 1 (the Hugging Face token secret 'hf-token' exists) failed with exit status 1" in result.output
    )
    assert "You do not currently have an active account selected" in streamed.err  # gcloud's own output
    assert "gcloud compute instances create" not in result.output  # nothing created after a failed preflight
    name = tomllib.loads(text)["name"]
    assert (
        (tmp_path / "opendecide-deploy" / f"{name}.startup.sh").read_text().startswith("#!/usr/bin/env bash")
    )


def test_dry_run_shows_the_pins_flags_teardown_and_upload(example_name):
    run = example(example_name)
    out = (
        CliRunner()
        .invoke(app, ["deploy", str(ROOT / "deploy" / "runs" / f"{example_name}.toml"), "--dry-run"])
        .stdout
    )
    lines = out.splitlines()
    # Both images pinned by digest; no floating tag anywhere.
    assert f"ENGINE_IMAGE={run.engine_image}" in lines and f"SERVICE_IMAGE={run.service_image}" in lines
    assert "@sha256:" in run.engine_image and ":nightly" not in out and ":latest" not in out
    # Every serve flag, on the model's line of the settings block.
    serve = next(line for line in lines if line.startswith("SERVE_FLAGS_0="))
    for flag in (
        f"--max-model-len {run.models[0].max_model_len}",
        "--max-num-seqs 16",
        "--max-logprobs 32",
        "--generation-config vllm",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        # Images read only by a model whose run file says how many (v6e-vision), audio never.
        f"""--limit-mm-per-prompt '{{"image":{run.models[0].images},"audio":0}}'""",
    ):
        assert flag in serve, flag
    assert ("--trust-request-chat-template" in serve) == bool(run.models[0].images)
    # The self-delete, run from the exit trap after the upload, and the cloud-side backstop.
    assert f"SELF_DELETE=({shlex.join(self_delete_command(run))})" in lines
    assert (
        "trap finish EXIT" in lines
        and '  if upload; then echo "uploaded $RUN_DIR to $DEST"; else echo "upload to $DEST failed"; fi'
        in lines
    )
    if run.platform == "aws":
        assert "    --instance-initiated-shutdown-behavior terminate \\" in lines
        assert (
            '  shutdown -h "+$(( MAX_RUN_SECONDS / 60 ))" >/dev/null 2>&1' in lines
            and "MAX_RUN_SECONDS=14400" in lines
        )
    else:
        assert "    --max-run-duration 4h \\" in lines
    # No secret in metadata: the only metadata is the script file; the token is read at boot.
    assert not any(line.strip().startswith("--metadata ") for line in lines)
    assert "HF_SECRET=hf-token" in lines and "HF_TOKEN=$token" in "\n".join(lines)
