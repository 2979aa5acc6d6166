"""SIGHUP from the first instant of ``decide serve``: during start-up and with keys from the
environment it logs that there is nothing to reload, and the server keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deploy.processes import free_port, wait_for_models

pytestmark = pytest.mark.integration  # a server process

ROOT = Path(__file__).resolve().parents[2]
KEY = "od-signal-test-key-0a1b2c3d4e5f"


def wait_for_line(log: Path, text: str, server: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s  # a hang guard, not a speed bound
    while text not in log.read_text():
        assert server.poll() is None, f"the server exited ({server.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in:\n{log.read_text()}"
        time.sleep(0.02)


def test_sighup_during_start_up_and_with_keys_from_the_environment_is_logged_not_fatal(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    # An engine that is not there: the service still listens (503 until it answers), no model needed.
    command = [
        sys.executable, "-m", "opendecide", "serve", "--port", str(port), "--engine", "vllm",
        "--engine-url", f"http://127.0.0.1:{free_port()}", "--store", str(tmp_path / "store.sqlite3"),
    ]  # fmt: skip
    env = dict(os.environ, OPENDECIDE_API_KEYS=KEY)
    server = subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        # The key line is written before the store and engine open and the server listens.
        wait_for_line(log, "authentication on: 1 API key(s)", server)
        server.send_signal(signal.SIGHUP)
        wait_for_models(url, process=server, log=log, path="/healthz")
        server.send_signal(signal.SIGHUP)
        wait_for_line(log, f"SIGHUP: nothing to reload (keys come from {'$OPENDECIDE_API_KEYS'}", server)
        refused = httpx.get(f"{url}/v1/models?api_key={KEY}", timeout=10)
        served = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert refused.status_code == 400 and refused.json()["detail"]["param"] == "api_key"
    assert served.status_code in (200, 503)  # the key is taken; the absent engine answers 503
    text = log.read_text()
    assert text.count("SIGHUP: nothing to reload") == 2, text
    assert KEY not in text  # uvicorn's access line printed the query: its value is redacted
    assert "api_key=[redacted]" in text
