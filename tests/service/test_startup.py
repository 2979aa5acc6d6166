"""The service starts before its engine answers: 503 with the reason until the engine is ready."""

from __future__ import annotations

import anyio
import httpx
import pytest

from readers.errors import EngineUnavailable
from service.app import create_app

pytestmark = pytest.mark.anyio


@pytest.mark.slow  # the engine opened after refused attempts, then decisions read
async def test_requests_get_503_until_the_engine_opens(local_engine):
    attempts = []

    async def opener():
        attempts.append(1)
        if len(attempts) < 3:
            raise EngineUnavailable("engine at http://127.0.0.1:1 is unreachable")
        return local_engine.with_top_k(
            None
        )  # a view that does not own the shared compute thread: the app closes it

    app = create_app(open_engine=opener)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            early = await client.get("/v1/models")
            assert early.status_code == 503 and "retry-after" in early.headers
            assert early.json()["detail"]["error_type"] == "engine_unavailable"
            decision = await client.post(
                "/v1/systemone",
                json={"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}},
            )
            assert decision.status_code == 503 and decision.json()["detail"]["message"].startswith(
                "not ready"
            )
            not_ready = await client.get("/readyz")
            live = await client.get("/healthz")
            assert not_ready.status_code == 503 and live.status_code == 200
            for _ in range(100):
                ready = await client.get("/v1/models")
                if ready.status_code == 200:
                    break
                await anyio.sleep(0.1)
            assert ready.status_code == 200 and len(attempts) == 3
