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
from tests.service.support import RUN_SUMMARIES, favour_first, function_engine

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


@pytest.mark.slow  # waits out READY_PROGRESS_S and the probe's timeout on a real clock
def test_readyz_turns_503_soon_after_a_real_vllm_client_stops_getting_answers(embedded_model_dir):
    """The issue's case end to end: decisions in flight through the real vLLM engine client to a
    loopback stand-in vLLM that stops answering (its replies hang). /readyz, 200 while decisions
    complete, turns 503 though reads are in flight: READY_PROGRESS_S without a completed read, then
    the probe's own timeout (8 s by construction; the fake-clock test above pins the rule)."""
    import http.server
    import time

    import httpx

    from deploy.processes import serving
    from readers.engines import open_engine
    from service.app import create_app
    from tests.integration.standin_vllm import handler

    hung = threading.Event()
    released = threading.Event()

    class Hanging(handler(str(embedded_model_dir))):
        def do_POST(self):
            if hung.is_set():
                released.wait(120)  # a vLLM that accepted the request and never answers
            try:
                super().do_POST()
            except (BrokenPipeError, ConnectionResetError):  # released after its caller gave up
                pass

    standin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    threading.Thread(target=standin.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{standin.server_address[1]}"

    async def opener():
        return await open_engine("vllm", url=url, model_dir=embedded_model_dir, timeout_s=120)

    app = create_app(open_engine=opener)
    body = {"state": "The parcel came late.", "questions": {"q": {"type": "noul", "instructions": "Late?"}}}
    statuses: list[int | str] = []
    stop = threading.Event()
    try:
        with serving(app) as served:

            def load():
                with httpx.Client(base_url=served, timeout=150) as client:
                    while not stop.is_set():
                        try:
                            statuses.append(client.post("/v1/systemone", json=body).status_code)
                        except httpx.TransportError as error:
                            statuses.append(type(error).__name__)

            with httpx.Client(base_url=served, timeout=30) as client:
                for _ in range(100):  # the engine opens in the background
                    if client.get("/readyz").status_code == 200:
                        break
                    time.sleep(0.1)
                loaders = [threading.Thread(target=load, daemon=True) for _ in range(2)]
                for loader in loaders:
                    loader.start()
                time.sleep(1.0)
                assert client.get("/readyz").status_code == 200 and 200 in statuses
                hung.set()
                since = time.monotonic()
                ready = 200
                while ready == 200 and time.monotonic() - since < 30:
                    time.sleep(0.25)
                    ready = client.get("/readyz").status_code
                took = time.monotonic() - since
            stop.set()
            released.set()
            for loader in loaders:
                loader.join(timeout=30)
    finally:
        released.set()
        standin.shutdown()
    RUN_SUMMARIES.append(
        f"/readyz after the stand-in vLLM stopped answering under load: {ready} in {took:.1f} s"
    )
    assert ready == 503, took
