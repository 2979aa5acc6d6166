"""Shared by the eval tests: small real runs made here (never the committed evidence), and a Cloud Storage emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.processes import free_port


@pytest.fixture(scope="session")
def tasks_run(local_engine, tmp_path_factory) -> Path:
    """A real, small `decide eval tasks` run on the embedded engine, scored: records, manifest, latency, scores."""
    import asyncio

    from eval.decisions.runner import measure_latency, run_tasks
    from eval.decisions.score import write_score

    out = tmp_path_factory.mktemp("tasks-run") / "embedded-exact"

    async def go() -> None:
        await run_tasks(local_engine, out, tasks=["sst2"], limit=6)
        await measure_latency(local_engine, out, requests_c1=3, requests_c8=8)

    asyncio.run(go())
    write_score(out)
    return out


SMALL_SWEEP = dict(concurrencies=(1, 8), passes=1, requests=8, long_tokens=())


@pytest.fixture(scope="session")
def load_run(local_engine, tmp_path_factory) -> Path:
    """A real, small `decide eval load` sweep through the service on the embedded engine."""
    import asyncio

    from eval.capacity.sweep import run_sweep, write_sweep_report
    from service.app import create_app

    out = tmp_path_factory.mktemp("load-run") / "load"
    rows = asyncio.run(run_sweep(local_engine, out, service_app=create_app, **SMALL_SWEEP))
    write_sweep_report(rows, out, "embedded (test)")
    return out


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
    from eval.evidence.storage import storage_client

    client = storage_client(emulator)
    name = request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:60].strip("-")
    client.create_bucket(name)
    return client, name
