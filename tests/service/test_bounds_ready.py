"""Truthful readiness: /readyz probes the engine with a real read (cached briefly), says not ready
when the engine is gone and ready again when it is back; an engine that cannot open makes
``decide serve`` exit non-zero."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import threading

import pytest

from deploy.processes import free_port
from readers.engines.base import ReadMode
from readers.errors import EngineUnavailable
from service.routes import operations
from tests.service.support import favour_first, function_engine

pytestmark = pytest.mark.anyio


def stoppable_engine(local_engine, engine_state: dict):
    """A function engine (no model) standing in for a vLLM server that is stopped and restarted:
    while ``stopped`` its reads fail as a refused connection does."""

    def fn(request):
        engine_state["reads"] += 1
        if engine_state["stopped"]:
            raise EngineUnavailable("engine at http://127.0.0.1:8104 refused the connection")
        return favour_first(request)

    return function_engine(local_engine, fn, ReadMode.EXACT)


async def test_readyz_follows_the_engine_going_and_coming_back(client_factory, local_engine, monkeypatch):
    monkeypatch.setattr(operations, "READY_CACHE_S", 0.3)
    engine_state = {"stopped": False, "reads": 0}
    async with client_factory(stoppable_engine(local_engine, engine_state)) as client:
        before = await client.get("/readyz")
        engine_state["stopped"] = True
        cached = await client.get("/readyz")  # within the cache: the last probe's answer
        await asyncio.sleep(0.4)
        gone = await client.get("/readyz")
        decision = await client.post(
            "/v1/systemone", json={"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
        )
        engine_state["stopped"] = False
        await asyncio.sleep(0.4)
        back = await client.get("/readyz")
    assert before.status_code == 200 and before.json()["status"] == "ready"
    assert cached.status_code == 200
    assert gone.status_code == 503 and decision.status_code == 503
    detail = gone.json()["detail"]
    assert detail["error_type"] == "engine_unavailable" and "refused the connection" in detail["message"]
    assert "retry-after" in gone.headers
    assert back.status_code == 200


async def test_concurrent_probes_share_one_read(client_factory, local_engine):
    engine_state = {"stopped": False, "reads": 0}
    async with client_factory(stoppable_engine(local_engine, engine_state)) as client:
        responses = await asyncio.gather(*(client.get("/readyz") for _ in range(20)))
    assert {r.status_code for r in responses} == {200} and engine_state["reads"] == 1


async def test_a_hung_engine_is_not_ready(client_factory, local_engine, monkeypatch):
    monkeypatch.setattr(operations, "PROBE_TIMEOUT_S", 0.3)

    async def hung(request):
        await asyncio.Event().wait()

    async with client_factory(function_engine(local_engine, hung, ReadMode.EXACT)) as client:
        response = await client.get("/readyz")
    assert response.status_code == 503 and "did not answer a one-token read" in response.text


class StandInModels(http.server.BaseHTTPRequestHandler):
    """Answers GET /v1/models as vLLM does; the engine then fails to open on the chat template."""

    def do_GET(self):
        body = json.dumps({"data": [{"id": "stand-in", "max_model_len": 2048}]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.integration  # starts `decide serve`
def test_serve_exits_non_zero_when_the_engine_cannot_open(embedded_model_dir, tmp_path):
    models = http.server.HTTPServer(("127.0.0.1", 0), StandInModels)
    threading.Thread(target=models.serve_forever, daemon=True).start()
    template = tmp_path / "broken.jinja"
    template.write_text("{% if %}")  # not a template: the engine cannot render a prompt
    command = [
        sys.executable, "-c", "from opendecide.cli import app; app()", "serve",
        "--engine", "vllm", "--engine-url", f"http://127.0.0.1:{models.server_address[1]}",
        "--tokenizer", str(embedded_model_dir), "--chat-template", str(template),
        "--store", str(tmp_path / "c.sqlite3"), "--port", str(free_port()),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        models.shutdown()
    assert done.returncode != 0, done.stderr[-2000:]
    assert "engine failed to open" in done.stderr


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_busy_is_ready_only_while_reads_complete_and_a_hung_engine_under_load_is_not(
    client_factory, local_engine, monkeypatch
):
    """A function engine whose reads of the "long" state and the probe's own read wait on a gate (a
    long read in flight, the probe queued behind it, as on a busy engine). /readyz says ready while
    other decisions' reads keep completing, and 503 once none has completed for READY_PROGRESS_S:
    reads in flight are no proof of life (issue 39: readyz stayed 200 for 75 s of a hung vLLM while
    one request was in flight). It answers within the kubelet's timeoutSeconds either way."""
    import yaml

    from readers.reader import ReadProgress

    monkeypatch.setattr(operations, "PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(operations, "READY_CACHE_S", 0.0)
    manifest = yaml.safe_load_all(open("deploy/k8s/base/service-deployment.yaml"))
    [deployment] = [doc for doc in manifest if doc and doc.get("kind") == "Deployment"]
    [service] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if "readinessProbe" in c]
    k8s_timeout_s = service["readinessProbe"]["timeoutSeconds"]
    gate = asyncio.Event()
    tokenizer = local_engine.tokenizer

    async def gated(request):
        if len(request.prompt_ids) == 1 or "Zebra" in tokenizer.decode(request.prompt_ids):
            await gate.wait()
        return favour_first(request)

    def ask(state):
        return client.post(
            "/v1/systemone", json={"state": state, "questions": {"q": {"type": "noul", "instructions": "?"}}}
        )

    clock = FakeClock()
    async with client_factory(function_engine(local_engine, gated, ReadMode.EXACT)) as client:
        app = client._transport.app
        app.state.reader.progress = ReadProgress(clock=clock)  # what every tenant's view of the reader shares
        long = asyncio.create_task(ask("Zebra " * 50))
        await asyncio.sleep(0.2)
        hung = await client.get("/readyz")  # nothing ever completed, one read in flight: not ready
        assert (await ask("a quick one")).status_code == 200  # a decision's read completes at t = 100
        clock.now += operations.READY_PROGRESS_S - 1
        busy = await client.get("/readyz")
        clock.now += 2  # READY_PROGRESS_S + 1 since the last completed read
        stalled = await client.get("/readyz")
        assert not long.done()
        gate.set()
        assert (await long).status_code == 200
    assert hung.status_code == 503 and "completed no read" in hung.text
    assert busy.status_code == 200
    assert stalled.status_code == 503 and "completed no read" in stalled.text
    # The probe's timeout, not a measured time, is what must sit under the kubelet's.
    assert operations.PROBE_TIMEOUT_S <= k8s_timeout_s - 1, (operations.PROBE_TIMEOUT_S, k8s_timeout_s)
