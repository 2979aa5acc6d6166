"""Every command ``decide deploy`` generates, run through the installed cloud CLIs' own parsers.

gcloud (528.0.0, alpha component) parses a command's flags before it needs credentials: with an empty
config it answers "You do not currently have an active account selected" to a command it accepted and
"unrecognized arguments" / "Invalid choice" to one it did not. The AWS CLI does the same with "Unable to
locate credentials". Neither reaches the network here.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from deploy.launch import plan
from deploy.targets import self_delete_command
from tests.deploy.run_files import PLACEHOLDER_PROJECT, example
from tests.tools import require_tool

pytestmark = pytest.mark.integration  # runs the gcloud and aws CLIs

GCLOUD_ACCEPTED = "You do not currently have an active account selected"
AWS_ACCEPTED = "Unable to locate credentials"


@pytest.fixture
def cli_env(tmp_path) -> dict[str, str]:
    """No user state read or written: an empty gcloud config and AWS config, no instance metadata."""
    config = tmp_path / "gcloud"
    config.mkdir()
    env = dict(os.environ)
    env.update(
        CLOUDSDK_CONFIG=str(config),
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_CORE_PROJECT=PLACEHOLDER_PROJECT,
        AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE",
    ):
        env.pop(name, None)
    return env


def parse(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    """(accepted, output) for one command; only gcloud and aws commands are checked."""
    result = subprocess.run(
        [require_tool(argv[0]), *argv[1:]], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    accepted = (GCLOUD_ACCEPTED if argv[0] == "gcloud" else AWS_ACCEPTED) in output
    return accepted and result.returncode != 0, output


def test_every_generated_command_parses(example_name, cli_env, tmp_path):
    run = example(example_name, **({} if example_name == "l4-aws" else {"project": PLACEHOLDER_PROJECT}))
    the_plan = plan(run, directory=tmp_path)
    the_plan.script_path.write_text(the_plan.script)  # --metadata-from-file / file:// name a real file
    commands = [step.argv for step in the_plan.steps + the_plan.after] + [self_delete_command(run)]
    checked = 0
    for argv in commands:
        if argv[0] not in ("gcloud", "aws"):
            assert argv == ["shutdown", "-h", "now"]  # the EC2 self-delete (terminate on shutdown)
            continue
        accepted, output = parse(argv, cli_env)
        assert accepted, f"{' '.join(argv)}\n{output}"
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (
            [
                "gcloud",
                "compute",
                "instances",
                "create",
                "x",
                "--zone",
                "europe-west4-a",
                "--provisioning-model",
                "FLEX_START",
            ],
            "Invalid choice: 'FLEX_START'",
        ),  # GA has no flex-start: why v6e flex-start uses `gcloud alpha`
        (
            [
                "gcloud",
                "alpha",
                "compute",
                "instances",
                "create",
                "x",
                "--zone",
                "europe-west4-a",
                "--request-valid-for-duration",
                "2h",
            ],
            "unrecognized arguments",
        ),  # not in 528
        (
            [
                "gcloud",
                "compute",
                "tpus",
                "queued-resources",
                "create",
                "x",
                "--zone",
                "us-west4-a",
                "--node-id",
                "n",
                "--accelerator-type",
                "v5litepod-1",
                "--runtime-version",
                "v2-alpha-tpuv5-lite",
                "--max-run-duration",
                "4h",
            ],
            "unrecognized arguments",
        ),  # GA queued resources: no flex-start flags
        (
            [
                "aws",
                "ec2",
                "run-instances",
                "--region",
                "us-east-1",
                "--instance-type",
                "g6.xlarge",
                "--max-run-duration",
                "4h",
            ],
            "Unknown options",
        ),
    ],
)
def test_the_check_tells_a_refused_flag(argv, refusal, cli_env):
    accepted, output = parse(argv, cli_env)
    assert not accepted and refusal in output, output
