"""``pip install opendecide`` (no extra) is the service against a vLLM engine, without torch.

A fresh venv gets the wheel and the base requirements from the index (pip's cache makes that quick;
nothing of this venv is visible there), ``decide serve --engine vllm`` starts in it against a stand-in
vLLM on loopback (``tests/integration/standin_vllm.py``), and answers a decision over HTTP. In that venv
the local engine's module fails naming the extra that installs it. Nothing skips: a missing index or
model folder fails the test, on CI and off it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploy.processes import free_port, wait_for_models
from tests.wheels import ROOT, build_wheel, clean_env, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """A venv with the wheel and its base requirements only."""
    tmp = tmp_path_factory.mktemp("base")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)], env=clean_env())
    return venv


def test_the_base_install_has_no_torch_and_names_the_local_extra(base_venv, embedded_model_dir, tmp_path):
    python = str(base_venv / "bin" / "python")
    found = run([python, "-c", "import importlib.util as u; print(u.find_spec('torch'))"], cwd=tmp_path)
    assert found.strip() == "None"
    assert "serve" in run([str(base_venv / "bin" / "decide"), "--help"], cwd=tmp_path, env=clean_env())
    result = subprocess.run(
        [python, "-c", "import readers.engines.local"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=120,
    )
    assert result.returncode != 0
    assert "MissingExtra: the local engine needs torch: pip install 'opendecide[local]'" in result.stderr
    # the command line says it in one line, without a traceback
    served = subprocess.run(
        [
            str(base_venv / "bin" / "decide"),
            "serve",
            "--model-dir",
            str(embedded_model_dir),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=120,
    )
    assert served.returncode != 0 and "Traceback" not in served.stderr
    assert "needs torch: pip install 'opendecide[local]'" in served.stderr


def test_the_base_install_serves_a_decision_from_a_vllm_engine(base_venv, embedded_model_dir, tmp_path):
    engine_port, service_port = free_port(), free_port()
    engine = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.standin_vllm", str(engine_port), str(embedded_model_dir)],
        cwd=ROOT,
    )
    log = tmp_path / "service.log"
    try:
        wait_for_models(f"http://127.0.0.1:{engine_port}", process=engine, timeout_s=30)
        with log.open("w") as out:
            service = subprocess.Popen(
                [
                    str(base_venv / "bin" / "decide"),
                    *("serve", "--engine", "vllm", "--port", str(service_port)),
                    *("--engine-url", f"http://127.0.0.1:{engine_port}"),
                ],
                cwd=tmp_path,
                env=clean_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            url = f"http://127.0.0.1:{service_port}"
            wait_for_models(url, process=service, log=log, path="/readyz")
            body = {
                "state": "The parcel never arrived.",
                "questions": {"late": {"type": "noul", "instructions": "Is the customer complaining?"}},
            }
            response = httpx.post(f"{url}/v1/systemone", json=body, timeout=60)
            assert response.status_code == 200, response.text
            answer = response.json()["answers"]["late"]
            assert 0.0 <= answer["noul"] <= 1.0 and answer["x_reading"]["labels_returned"] >= 1
        finally:
            service.terminate()
            service.wait(timeout=30)
    finally:
        engine.terminate()
        engine.wait(timeout=30)
