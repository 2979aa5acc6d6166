"""What one tenant sent stays its own (issue 40): the embedded model's prompt cache is salted per
tenant, so another tenant's reads never reuse it, and neither do its content-free priors.

The attack the issue measured, as a test: tenant a's state holds a PIN; tenant b guesses it a digit
at a time and keeps the guess whose read reused the most tokens (``x_reading.tokens_reused``, and
``usage.input_tokens_details.cached_tokens`` on OpenAI's route). Before salts b recovered the PIN in
40 requests; here every guess reuses exactly what a fresh state of b's own does. A real app over
ASGI, a key file with two tenants, the embedded model with its own prefix cache.
"""

from __future__ import annotations

import pytest

from readers.engines.base import LocalBatching
from readers.engines.local import LocalEngine
from service.keys import Keyring

pytestmark = pytest.mark.anyio

A = "tenant-a-key-0123456789abcdef"
B = "tenant-b-key-0123456789abcdef"
C = "tenant-c-key-0123456789abcdef"  # c and d: one cache group on purpose
D = "tenant-d-key-0123456789abcdef"
NOUL = {"type": "noul", "instructions": "Does the customer ask for money back?"}
SECRET = "Account note: the customer's PIN is 4829. They ask about the parcel that came late."


def guess(digits: str) -> str:
    """b's guess: a's state up to the PIN's first ``digits``, then text of b's own."""
    return f"Account note: the customer's PIN is {digits} and more text that b wrote itself."


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
async def salted(client_factory, embedded_model_dir, tmp_path):
    """A client of an app over a fresh embedded engine (an empty prefix cache), keys of tenants a, b."""
    keys = tmp_path / "keys.txt"
    keys.write_text(
        f"{A} tenant=a\n{B} tenant=b\n{C} tenant=c cache_group=desk\n{D} tenant=d cache_group=desk\n"
    )
    engine = LocalEngine(embedded_model_dir, batching=LocalBatching(prefix_cache_mib=64))
    try:
        async with client_factory(engine, api_keys=Keyring(keys, {})) as client:
            yield client, engine
    finally:
        await engine.aclose()


async def reused(client, key: str, state: str) -> int:
    response = await client.post(
        "/v1/systemone", json={"state": state, "questions": {"q": NOUL}}, headers=auth(key)
    )
    assert response.status_code == 200, response.text
    return response.json()["answers"]["q"]["x_reading"]["tokens_reused"]


async def test_the_pin_attack_recovers_nothing(salted):
    client, _ = salted
    await reused(client, A, SECRET)
    await reused(client, B, "A warm-up state of b's own.")  # b's system prompt and question: cached for b
    by_digit = {d: await reused(client, B, guess(f"4{d}")) for d in "0123456789"}
    # Every guess after the first reuses what b's own cache holds (its system prompt and question,
    # and "…PIN is 4" from its own first guess); the true digit no more than any other. Before salts,
    # "8" reused a's "8" too, and each next digit the same way.
    assert len({by_digit[d] for d in "123456789"}) == 1, by_digit
    # a's own cache still works: its state again reuses far more than any of b's guesses.
    assert await reused(client, A, SECRET) > max(by_digit.values()) + 10


async def test_openai_cached_tokens_count_only_the_callers_own_cache(salted):
    client, _ = salted
    body = {
        "model": "gpt-6-luna",
        "input": SECRET,
        "questions": [{"type": "predicate", "instructions": "Late?"}],
    }

    async def cached(key: str) -> int:
        response = await client.post("/v1/decisions", json=body, headers=auth(key))
        assert response.status_code == 200, response.text
        return response.json()["usage"]["input_tokens_details"]["cached_tokens"]

    first_a = await cached(A)
    first_b = await cached(B)  # the same input, another tenant: nothing of a's is served to it
    again_a = await cached(A)
    assert first_b == first_a == 0
    assert again_a > 0


async def test_a_content_free_prior_is_measured_per_tenant(salted):
    """A choice question's prior read by a, then the same question by b: b measures its own (its
    engine reads), where before it answered at once from a's, showing that a had asked it."""
    client, engine = salted
    body = {
        "state": "The parcel came late and the box was torn.",
        "questions": {"q": {"type": "choice", "instructions": "Which team?", "criteria": {"Shipping": None, "Billing": None}}},
    }  # fmt: skip

    async def reads(key: str) -> int:
        before = engine.batched_reads
        response = await client.post("/v1/systemone", json=body, headers=auth(key))
        assert response.status_code == 200, response.text
        assert response.json()["answers"]["q"]["x_reading"]["prior_correction"] is not None
        return engine.batched_reads - before

    first_a = await reads(A)
    again_a = await reads(A)
    first_b = await reads(B)
    assert again_a < first_a  # a's prior is cached for a
    assert first_b == first_a  # b's is measured afresh, as a's was


async def test_tenants_of_one_cache_group_share_their_cache(salted):
    """A key file's cache_group puts tenants in one cache on purpose: d reuses what c read."""
    client, _ = salted
    await reused(client, C, SECRET)
    assert await reused(client, D, SECRET) == await reused(client, C, SECRET) > 0  # d never sent it
    assert await reused(client, A, SECRET) == 0  # a is not in the group: a cold read of its own
