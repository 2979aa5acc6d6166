"""``decide``: ask in process, and serve for real answering the README's curl."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from opendecide.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_ask_prints_a_jev_answer(embedded_model_dir):
    result = CliRunner().invoke(
        app,
        ["ask", "--state", "The soup was cold and the waiter rude.", "--choice", "positive,negative", "--instructions", "Sentiment?"],
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)["answers"]["answer"]
    assert answer["type"] == "choice" and set(answer["probabilities"]) == {"positive", "negative"}
    assert answer["reading"]["read_mode"] == "exact"


def test_ask_refuses_two_question_kinds():
    result = CliRunner().invoke(app, ["ask", "--state", "s", "--noul", "--choice", "a,b"])
    assert result.exit_code != 0 and "exactly one of" in result.output


def readme_curl() -> str:
    """The curl under the README's quick start (the one a new user runs after `make serve`)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart-curl -->\s*```sh\n(.*?)```", text, re.S)
    assert block, "README has no quick-start curl block"
    return block.group(1).replace("\\\n", " ").strip()


def test_serve_answers_the_readme_curl(embedded_model_dir, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "opendecide", "serve", "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "decide serve did not become ready"
            time.sleep(0.5)
        command = shlex.split(readme_curl().replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
        assert command[0] == "curl"
        output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60, env=os.environ).stdout
        body = json.loads(output)
        assert body["model"] == "smollm2-135m-instruct"
        (answer,) = body["answers"].values()
        assert answer["type"] in {"noul", "choice", "score"} and "reading" in answer
    finally:
        server.terminate()
        server.wait(timeout=30)
