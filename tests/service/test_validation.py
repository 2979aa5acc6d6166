"""Bad input gets a 4xx naming the field; nothing is truncated."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


def choice(criteria) -> dict:
    return {
        "state": "text",
        "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": criteria}},
    }


CASES = [
    ("one option", choice({"a": None}), ["body", "questions", "q", "choice", "criteria"], "2 to 255 options"),
    ("empty criteria", choice({}), ["body", "questions", "q", "choice", "criteria"], "2 to 255 options"),
    (
        "256 options",
        choice({f"o{i}": None for i in range(256)}),
        ["body", "questions", "q", "choice", "criteria"],
        "got 256",
    ),
    (
        "same option twice",
        choice({"yes": None, "yes ": None}),
        ["body", "questions", "q", "choice", "criteria"],
        "duplicate options",
    ),
    (
        "look-alike options across scripts",
        choice({"paid": None, "p\u0430id": None}),
        ["body", "questions", "q", "choice", "criteria"],
        "a reader takes them for one",
    ),
    (
        "the same level twice",
        {
            "state": "s",
            "questions": {"q": {"type": "score", "instructions": "How?", "criteria": ["low", "high", "low"]}},
        },
        ["body", "questions", "q", "score", "criteria"],
        "criteria[0] and criteria[2] are the same level",
    ),
    (
        "empty option name",
        choice({"": None, "b": None}),
        ["body", "questions", "q", "choice", "criteria"],
        "must not be empty",
    ),
    (
        "score with 1 level",
        {"state": "s", "questions": {"q": {"type": "score", "instructions": "How?", "criteria": ["only"]}}},
        ["body", "questions", "q", "score", "criteria"],
        "2 to 10 levels",
    ),
    (
        "score with 11 levels",
        {
            "state": "s",
            "questions": {
                "q": {"type": "score", "instructions": "How?", "criteria": [str(i) for i in range(11)]}
            },
        },
        ["body", "questions", "q", "score", "criteria"],
        "got 11",
    ),
    (
        "unknown type",
        {"state": "s", "questions": {"q": {"type": "triangle"}}},
        ["body", "questions", "q"],
        "'noul', 'choice', 'score'",
    ),
    ("no questions", {"state": "s", "questions": {}}, ["body", "questions"], "1 to 400 questions"),
    (
        "no state",
        {"questions": {"q": {"type": "noul", "instructions": "?"}}},
        ["body", "state"],
        "Field required",
    ),
    (
        "unknown field in a question",
        {"state": "s", "questions": {"q": {"type": "noul", "instructions": "?", "critera": {}}}},
        ["body", "questions", "q", "noul", "critera"],
        "Extra inputs",
    ),
    (
        "noul asks nothing",
        {"state": "s", "questions": {"q": {"type": "noul"}}},
        ["body", "questions", "q", "noul"],
        "needs instructions",
    ),
    (
        "401 questions",
        {"state": "s", "questions": {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(401)}},
        ["body", "questions"],
        "got 401",
    ),
    (
        "an image asset without its image",
        {
            "state": "s",
            "assets": {"img": {"type": "image", "format": "png"}},
            "questions": {"q": {"type": "noul", "instructions": "?"}},
        },
        ["body", "assets", "img"],
        "either data_base64",
    ),
    (
        "unknown model",
        {"model": "gpt-9", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}},
        ["body", "model"],
        "unknown model",
    ),
]


@pytest.mark.parametrize("name, body, loc, message", CASES, ids=[case[0] for case in CASES])
async def test_invalid_requests_name_the_field(client_factory, local_engine, name, body, loc, message):
    async with client_factory(local_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(item["loc"] == loc and message in item["msg"] for item in detail), detail


async def test_duplicate_json_keys_are_refused_not_collapsed(client_factory, local_engine):
    raw = b'{"state": "s", "questions": {"q": {"type": "choice", "criteria": {"yes": null, "no": null, "yes": "again"}}}}'
    async with client_factory(local_engine) as client:
        response = await client.post(
            "/v1/systemone", content=raw, headers={"content-type": "application/json"}
        )
    assert response.status_code == 422
    assert "duplicate key 'yes'" in response.json()["detail"][0]["msg"]


async def test_invalid_json_is_a_422(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        response = await client.post(
            "/v1/systemone", content=b'{"state": ', headers={"content-type": "application/json"}
        )
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_invalid"


async def test_state_longer_than_the_context_is_refused_with_its_token_count(
    client_factory, local_engine, tokenizer
):
    state = "The quick brown fox jumps over the lazy dog. " * 1000
    body = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it about a fox?"}}}
    async with client_factory(local_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 413
    detail = response.json()["detail"]
    assert detail["error_type"] == "prompt_too_long" and detail["param"] == "body.questions.q"
    assert detail["context_length"] == 8192 and detail["prompt_tokens_exact"] is True
    assert detail["prompt_tokens"] > len(tokenizer.encode(state, add_special_tokens=False)) > 8192
    assert str(detail["prompt_tokens"]) in detail["message"]


async def test_deeply_nested_json_is_a_422_not_a_crash(client_factory, local_engine):
    deep = "[" * 5000 + "]" * 5000
    raw = ('{"state": ' + deep + ', "questions": {"q": {"type": "noul", "instructions": "?"}}}').encode()
    async with client_factory(local_engine) as client:
        response = await client.post(
            "/v1/systemone", content=raw, headers={"content-type": "application/json"}
        )
    assert response.status_code == 422 and "too deeply" in response.json()["detail"][0]["msg"]


async def test_a_state_far_too_long_is_refused_before_tokenizing(client_factory, local_engine):
    body = {"state": "x" * 2_000_000, "questions": {"q": {"type": "noul", "instructions": "?"}}}
    async with client_factory(local_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    detail = response.json()["detail"]
    assert response.status_code == 413 and detail["prompt_tokens_exact"] is False
    assert detail["prompt_tokens"] > detail["context_length"]
