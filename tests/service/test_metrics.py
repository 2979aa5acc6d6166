"""GET /metrics after real decisions on the embedded model, and the JSON access log."""

from __future__ import annotations

import json
import logging

import pytest

from readers.engines.base import Capabilities
from readers.engines.function import FunctionEngine
from readers.errors import EngineTimeout, EngineUnavailable
from tests.service.support import samples, value

pytestmark = pytest.mark.anyio

BODY = {
    "state": "My card was charged twice and I want my money back today.",
    "questions": {
        "billing": {"type": "noul", "instructions": "Is this about billing?"},
        "tone": {"type": "choice", "criteria": {"calm": None, "angry": None}},
    },
}


async def test_counters_and_histograms_move_with_real_decisions(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        before = samples((await client.get("/metrics")).text)
        readings = []
        for _ in range(3):
            response = await client.post("/v1/systemone", json=BODY)
            assert response.status_code == 200
            readings += [answer["x_reading"] for answer in response.json()["answers"].values()]
        assert (await client.post("/decide", json={"state": "x", "questions": {}})).status_code == 422
        after = samples((await client.get("/metrics")).text)
    model = local_engine.info.name
    # What the engine computed: the same request again reuses every token, each read's final hidden
    # state included (readers/engines/kvtree.py keeps it where a read ended).
    computed = sum(r["tokens_computed"] for r in readings)
    reused = sum(r["tokens_reused"] for r in readings)
    assert [r["tokens_computed"] for r in readings[-2:]] == [0, 0]
    assert all(r["tokens_computed"] + r["tokens_reused"] == r["prompt_tokens"] for r in readings)
    assert (
        value(after, "decide_prompt_tokens_total", kind="computed")
        - value(before, "decide_prompt_tokens_total", kind="computed")
        == computed
    )
    assert (
        value(after, "decide_prompt_tokens_total", kind="reused")
        - value(before, "decide_prompt_tokens_total", kind="reused")
        == reused
    )
    assert value(after, "decide_requests_total", route="/v1/systemone", status="200") == 3
    assert value(after, "decide_requests_total", route="/decide", status="422") == 1
    assert value(after, "decide_questions_total", model=model, type="noul", read_mode="exact") == 3
    assert value(after, "decide_questions_total", model=model, type="choice", read_mode="exact") == 3
    assert value(after, "decide_request_duration_seconds_count", route="/v1/systemone") == 3
    assert value(after, "decide_engine_duration_seconds_count") == 6
    assert value(after, "decide_engine_queue_seconds_count") == 6
    assert value(after, "decide_label_mass_count") == 6 and value(after, "decide_labels_missing_total") == 0
    assert value(after, "decide_answers_total", calibrated="false") == 6
    assert (
        value(after, "decide_prior_corrected_answers_total") == 3
    )  # the choice questions, corrected by default
    assert value(after, "decide_in_flight_requests") == 0
    info = [key for key in after if key[0] == "decide_engine_info"]
    assert info and dict(info[0][1])["model"] == model and dict(info[0][1])["read_mode"] == "exact"
    assert value(before, "decide_requests_total", route="/v1/systemone", status="200") == 0


async def test_engine_errors_are_counted_by_kind(client_factory, local_engine):
    errors = iter([EngineTimeout("slow"), EngineUnavailable("down")])

    def fail(request):
        raise next(errors)

    engine = FunctionEngine(
        fail,
        tokenizer=local_engine.tokenizer,
        info=local_engine.info,
        capabilities=Capabilities(local_engine.capabilities.read_mode, 32, 32),
    )
    body = {"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    async with client_factory(engine) as client:
        assert (await client.post("/v1/systemone", json=body)).status_code == 504
        assert (await client.post("/v1/systemone", json=body)).status_code == 503
        found = samples((await client.get("/metrics")).text)
    assert value(found, "decide_engine_errors_total", kind="timeout") == 1
    assert value(found, "decide_engine_errors_total", kind="unreachable") == 1
    assert value(found, "decide_requests_total", route="/v1/systemone", status="503") == 1


async def test_one_json_access_line_per_request(client_factory, local_engine, caplog):
    caplog.set_level(logging.INFO, logger="opendecide.access")
    async with client_factory(local_engine) as client:
        response = await client.post("/v1/systemone", json=BODY, headers={"x-request-id": "trace-42"})
    assert response.headers["x-request-id"] == "trace-42"
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "opendecide.access"]
    ids = sorted(answer["x_reading"]["decision_id"] for answer in response.json()["answers"].values())
    assert line["request_id"] == "trace-42" and line["status"] == 200 and line["route"] == "/v1/systemone"
    assert (
        sorted(line["decision_ids"]) == ids
        and line["model"] == local_engine.info.name
        and line["latency_ms"] > 0
    )


@pytest.mark.integration  # three worker processes
def test_several_worker_processes_aggregate(tmp_path):
    """prometheus-client's multiprocess mode: two workers count, a third serves the sum."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    count = "from service.metrics import ServiceMetrics; m = ServiceMetrics(); m.requests.labels('/decide', '200').inc({n})"
    for n in (2, 3):
        subprocess.run([sys.executable, "-c", count.format(n=n)], cwd=root, env=env, check=True)
    # The serving process's probe cache is read from it at the scrape (a process's own, not summed).
    show = (
        "from calibration.probe_cache import ProbeCache; from service.metrics import ServiceMetrics; "
        "m = ServiceMetrics(); m.watch_probe_cache(ProbeCache(total_bytes=7)); print(m.exposition()[0].decode())"
    )
    text = subprocess.run(
        [sys.executable, "-c", show], cwd=root, env=env, check=True, capture_output=True, text=True
    ).stdout
    assert value(samples(text), "decide_requests_total", route="/decide", status="200") == 5
    assert samples(text)[("decide_probe_cache_bytes", ())] == 0  # present: absent reads as a KeyError
