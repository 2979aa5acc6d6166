"""The rendered startup script: shellcheck-clean for every target, and run for real by bash with the
cloud's tools (docker, curl, gcloud, aws, shutdown) replaced by a recorder that answers like a healthy
machine, so the order of what it does (pull by digest, serve, wait, service, eval, upload, self-delete)
is observed, not grepped."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from deploy.runfile import TPU_ENGINE_IMAGE
from deploy.startup import TEMPLATE, render_startup_script, serve_flags, service_flags, settings
from deploy.targets import self_delete_command
from tests.deploy.run_files import ROOT, example
from tests.tools import require_tool

FAKE = Path(__file__).with_name("fake_cloud") / "fake.sh"
FAKE_TOKEN = "hf_fake_token_value_never_on_a_command_line"


def check_shell(path: Path) -> None:
    result = subprocess.run(
        [require_tool("shellcheck"), "--severity=style", str(path)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration  # runs shellcheck
def test_template_is_shellcheck_clean():
    check_shell(TEMPLATE)


@pytest.mark.integration  # runs shellcheck
def test_rendered_script_is_shellcheck_clean(example_name, tmp_path):
    path = tmp_path / "startup.sh"
    path.write_text(render_startup_script(example(example_name)))
    check_shell(path)


@pytest.mark.integration  # runs git and shellcheck
def test_every_shell_script_in_the_repository_is_shellcheck_clean():
    tracked = subprocess.run(
        ["git", "ls-files", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    scripts = [ROOT / line for line in tracked.stdout.split()] or [TEMPLATE]
    for script in scripts:
        check_shell(script)


def test_settings_are_the_only_change(example_name):
    rendered = render_startup_script(example(example_name)).splitlines()
    template = TEMPLATE.read_text().splitlines()
    start = next(i for i, line in enumerate(template) if line.startswith("# --- settings"))
    end = template.index("# --- end settings ---")
    assert rendered[:start] == template[:start]
    assert rendered[-(len(template) - end) :] == template[end:]


def calls_of(path: Path) -> list[list[str]]:
    """The recorder's log: one argv per line, NUL-separated."""
    return [line.rstrip("\0").split("\0") for line in path.read_text().split("\0\n") if line]


def boot(run, tmp_path, **env_changes) -> tuple[list[list[str]], str, str]:
    """Run the rendered script as the machine would on first boot; (calls, deploy.log, console)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "curl", "gcloud", "aws", "shutdown", "apt-get", "sleep"):
        (bin_dir / tool).symlink_to(FAKE)
    script = tmp_path / "startup.sh"
    script.write_text(render_startup_script(run))
    work = tmp_path / "work"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_CALLS": str(tmp_path / "calls"),
        "FAKE_HF_TOKEN": FAKE_TOKEN,
        "OPENDECIDE_WORK": str(work),
        "OPENDECIDE_CONSOLE": str(tmp_path / "console"),
        **env_changes,
    }
    (tmp_path / "calls").touch()
    result = subprocess.run(
        ["bash", str(script)], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return (
        calls_of(tmp_path / "calls"),
        (work / "run" / "deploy.log").read_text(),
        (tmp_path / "console").read_text(),
    )


def index_of(calls: list[list[str]], *prefix: str) -> int:
    for index, call in enumerate(calls):
        if call[: len(prefix)] == list(prefix):
            return index
    raise AssertionError(
        f"no call starting {' '.join(prefix)} in:\n" + "\n".join(shlex.join(c) for c in calls)
    )


@pytest.mark.integration  # bash runs the script
@pytest.mark.parametrize("name", ["v6e", "v6e-flex", "v5e", "l4-gcp", "l4-aws"])
def test_a_boot_runs_every_step_in_order(name, tmp_path):
    run = example(name)
    model = run.models[0]
    calls, log, console = boot(run, tmp_path)

    # The images are pulled by digest, the engine image being the run file's (the TPU default here).
    pulls = [c[-1] for c in calls if c[:2] == ["docker", "pull"]]
    assert pulls == [run.engine_image, run.service_image] and all("@sha256:" in p for p in pulls)
    if run.accelerator == "tpu":
        assert run.engine_image == TPU_ENGINE_IMAGE

    # The engine runs with every serve flag, after the model id, and is waited for.
    engine = calls[index_of(calls, "docker", "run", "-d", "--name", "vllm")]
    after_model = engine[engine.index(model.id) + 1 :]
    assert after_model == [
        "--served-model-name",
        model.id,
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        *serve_flags(run, model),
    ]
    for flag, value in [
        ("--max-num-seqs", "16"),
        ("--max-logprobs", "32"),
        ("--generation-config", "vllm"),
        ("--max-model-len", str(model.max_model_len)),
    ]:
        assert after_model[after_model.index(flag) + 1] == value
    assert "--enable-prefix-caching" in after_model and "--enable-prompt-tokens-details" in after_model
    assert json.loads(after_model[after_model.index("--limit-mm-per-prompt") + 1]) == {"image": 0, "audio": 0}
    assert f"READY {model.id} after " in log

    # The service in front, with both image refs for provenance.
    service = calls[index_of(calls, "docker", "run", "-d", "--name", "decide-service")]
    tail = service[service.index(run.service_image) + 1 :]
    assert tail == [
        "serve",
        *service_flags(run),
        "--tokenizer",
        model.id,
        "--engine-image",
        run.engine_image,
        "--service-image",
        run.service_image,
    ]
    assert f"SERVICE READY {model.id} after " in log

    # The eval, inside the service container, with the engine log and both images.
    evaluation = calls[index_of(calls, "docker", "exec", "decide-service", "decide", "eval", run.eval.run)]
    if run.eval.run in ("tasks", "suite"):
        assert evaluation[evaluation.index("--engine-log") + 1] == f"/out/{model.tag}/engine.log"
        assert evaluation[evaluation.index("--engine-image") + 1] == run.engine_image
        assert evaluation[evaluation.index("--service-image") + 1] == run.service_image
    assert evaluation[evaluation.index("--engine") + 1] == "vllm@http://127.0.0.1:8000"
    assert (
        (tmp_path / "work" / "run" / model.tag / "engine.log").read_text().startswith("INFO fake log of vllm")
    )

    # The upload, then the self-delete as the very last call.
    if run.platform == "aws":
        upload = index_of(calls, "aws", "s3", "cp", "--recursive")
        assert calls[upload][-1].startswith(f"{run.bucket}/{run.name}/")
        assert calls[index_of(calls, "shutdown")] == ["shutdown", "-h", "+240"]  # the backstop, first
    else:
        upload = index_of(calls, "docker", "run", "--rm")
        assert calls[upload][-4:-1] == ["eval", "upload", "/out"] and calls[upload][-1].startswith(
            f"{run.bucket}/{run.name}/"
        )
    assert calls[-1] == self_delete_command(run)
    assert index_of(calls, "docker", "exec") < upload < len(calls) - 1

    # The token came from the secret store and never appeared on a command line or in the logs.
    assert not any(FAKE_TOKEN in word for call in calls for word in call)
    assert FAKE_TOKEN not in log and FAKE_TOKEN not in console
    assert all(
        ("-e", "HF_TOKEN") == (c[i], c[i + 1])
        for c in calls
        if c[:2] == ["docker", "run"] and "-e" in c
        for i in [c.index("-e")]
    )
    assert f"Hugging Face token read from secret {run.hf_secret}" in log


@pytest.mark.integration  # bash runs the script
def test_an_engine_that_dies_still_uploads_and_deletes(tmp_path):
    run = example("v6e")
    calls, log, _ = boot(run, tmp_path, FAKE_ENGINE_DIES="1")
    assert f"FAILED {run.models[0].id} after " in log and "RuntimeError: fake engine died" in log
    assert not any(c[:3] == ["docker", "exec", "decide-service"] for c in calls)  # no eval on a dead engine
    index_of(calls, "docker", "run", "--rm")  # uploaded
    assert calls[-1] == self_delete_command(run)


def test_no_secret_in_metadata_and_the_backstop_set(example_name, tmp_path):
    from deploy.launch import plan

    run = example(example_name)
    create = plan(run, directory=tmp_path).steps[-1].argv
    assert "--metadata" not in create  # the only metadata is the startup script, read from a file
    if run.platform == "aws":
        assert create[create.index("--instance-initiated-shutdown-behavior") + 1] == "terminate"
        assert create[create.index("--user-data") + 1] == f"file://{tmp_path / f'{run.name}.startup.sh'}"
    else:
        assert (
            create[create.index("--metadata-from-file") + 1]
            == f"startup-script={tmp_path / f'{run.name}.startup.sh'}"
        )
        assert create[create.index("--max-run-duration") + 1] == "4h"
    if run.target in ("v6e", "l4-gcp"):
        assert create[create.index("--instance-termination-action") + 1] == "DELETE"
    if run.target == "v5e":
        assert create[create.index("--provisioning-model") + 1] == "flex-start"
        assert create[create.index("--valid-until-duration") + 1] == "2h"
    assert settings(run)["SELF_DELETE"] == self_delete_command(run)
