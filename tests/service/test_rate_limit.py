"""Per-key token buckets: 429 rate_limit_error with Retry-After, as Jev's SDK expects."""

from __future__ import annotations

import pytest

from deploy.processes import serving
from service.app import create_app
from service.middleware.rate_limit import TokenBuckets
from tests.tools import require_module

BODY = {"state": "Refund me.", "questions": {"q": {"type": "noul", "instructions": "Is it about money?"}}}
KEYS = ["od-key-aaaaaaaaaaaaaaaa", "od-key-bbbbbbbbbbbbbbbb"]


def test_bucket_spends_its_burst_then_refills_at_the_rate():
    now = [0.0]
    buckets = TokenBuckets(2.0, 3, clock=lambda: now[0])
    assert [buckets.take("a") for _ in range(3)] == [0, 0, 0]
    assert buckets.take("a") == pytest.approx(0.5)  # one token at 2/s
    assert buckets.take("b") == 0  # callers do not share a bucket
    now[0] += 0.5
    assert buckets.take("a") == 0
    now[0] += 100
    assert [buckets.take("a") for _ in range(4)][-1] > 0  # refills to the burst, no further


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        TokenBuckets(0, 3)
    with pytest.raises(ValueError):
        TokenBuckets(1.0, 0)


@pytest.mark.anyio
async def test_over_the_limit_is_a_429_per_key(client_factory, quick_engine):
    async with client_factory(quick_engine, api_keys=KEYS, rate_limit=(0.2, 2)) as client:
        first = [
            await client.post("/v1/systemone", json=BODY, headers={"authorization": f"Bearer {KEYS[0]}"})
            for _ in range(3)
        ]
        other = await client.post("/v1/systemone", json=BODY, headers={"authorization": f"Bearer {KEYS[1]}"})
        health = [await client.get("/healthz") for _ in range(5)]
    assert [r.status_code for r in first] == [200, 200, 429] and other.status_code == 200
    assert all(r.status_code == 200 for r in health)
    refused = first[2]
    assert refused.headers["retry-after"] == "5"  # one token at 0.2/s
    detail = refused.json()["detail"]
    assert detail["error_type"] == "rate_limit_error" and "0.2 requests/s" in detail["message"]


def test_the_sdk_raises_its_rate_limit_error_with_retry_after(quick_engine):
    """Jev's SDK, retries off, against a real server: its own 429 error, carrying Retry-After."""
    typesafe_sdk = require_module("typesafe_sdk")
    app = create_app(quick_engine, api_keys=KEYS, rate_limit=(0.2, 1))
    with serving(app) as url:
        with typesafe_sdk.TypeSafeClient(
            api_key=KEYS[0], base_url=url, retry=typesafe_sdk.RetryPolicy(max_retries=0)
        ) as client:
            client.system_one(
                state="Refund me.", questions={"q": typesafe_sdk.Noul(instructions="Is it about money?")}
            )
            with pytest.raises(typesafe_sdk.TypeSafeRateLimitError) as raised:
                client.system_one(
                    state="Refund me.", questions={"q": typesafe_sdk.Noul(instructions="Is it about money?")}
                )
    assert raised.value.status == 429 and raised.value.retry_after_ms == 5000
    assert "rate limit of 0.2 requests/s" in str(raised.value)
