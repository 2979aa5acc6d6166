"""``--metrics-port``: /metrics alone on its own listener, without a key, counting what the main port
served; nothing else is reachable there; a port that cannot be bound refuses the start by its option."""

from __future__ import annotations

import httpx
import pytest

from deploy.processes import free_port
from service.app import create_app
from service.server import ServeOptions, ServeRefused, run_server, start_metrics_listener

KEY = "metrics-port-key-0123456789ab"
BODY = {"state": "Refund me.", "questions": {"q": {"type": "noul", "instructions": "Is it about money?"}}}


@pytest.mark.anyio
async def test_metrics_listen_alone_without_a_key(quick_engine):
    app = create_app(quick_engine, api_keys=[KEY])
    server = start_metrics_listener(app.state.metrics, "127.0.0.1", free_port())
    (sock,) = server.servers[0].sockets
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://main") as main:
            asked = await main.post("/v1/systemone", json=BODY, headers={"authorization": f"Bearer {KEY}"})
            on_main = await main.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
        async with httpx.AsyncClient(base_url=url, timeout=10) as scraper:
            metrics = await scraper.get("/metrics")
            others = [await scraper.post("/v1/systemone", json=BODY), await scraper.get("/openapi.json")]
    finally:
        server.should_exit = True
    assert (
        asked.status_code == 200 and on_main.status_code == 403
    )  # a decide key: no metrics on the main port
    assert metrics.status_code == 200
    assert 'decide_requests_total{route="/v1/systemone",status="200"} 1.0' in metrics.text
    assert [r.status_code for r in others] == [404, 404]


def test_a_metrics_port_that_cannot_be_used_refuses_the_start(quick_engine):
    app = create_app(quick_engine)
    first = start_metrics_listener(app.state.metrics, "127.0.0.1", free_port())
    (sock,) = first.servers[0].sockets
    try:
        with pytest.raises(ServeRefused) as taken:
            start_metrics_listener(app.state.metrics, "127.0.0.1", sock.getsockname()[1])
    finally:
        first.should_exit = True
    assert taken.value.option == "--metrics-port"
    with pytest.raises(ServeRefused, match="--metrics-port must differ from --port"):
        run_server(ServeOptions(port=8123, metrics_port=8123))
