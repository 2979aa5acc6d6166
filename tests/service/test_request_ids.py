"""Ids a caller sends are its own: a client's ``x-request-id`` is namespaced by the caller's key id,
so tenant B cannot reuse tenant A's; every id accepted is bounded in length, and an error never
echoes more of it than the bound."""

from __future__ import annotations

import json
import logging

import pytest

from service.keys import Keyring, digest, key_id

pytestmark = pytest.mark.anyio

A = "ids-key-a-0123456789abcdef"
B = "ids-key-b-0123456789abcdef"
BODY = {"state": "Refund me.", "questions": {"q": {"type": "noul", "instructions": "Is it about money?"}}}


def access_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "opendecide.access"]


async def test_tenant_b_cannot_reuse_tenant_as_request_id(client_factory, quick_engine, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="opendecide.access")
    path = tmp_path / "keys"
    path.write_text(f"{A} tenant=a\n{B} tenant=b\n")
    async with client_factory(quick_engine, api_keys=Keyring(path, {})) as client:
        answers = [
            await client.post(
                "/v1/systemone",
                json=BODY,
                headers={"authorization": f"Bearer {key}", "x-request-id": "trace-42"},
            )  # fmt: skip
            for key in (A, B)
        ]
    ids = [f"{key_id(digest(key))}:trace-42" for key in (A, B)]
    for answer, wanted in zip(answers, ids, strict=True):
        assert answer.status_code == 200
        assert answer.headers["x-request-id"] == wanted == answer.headers["x-typesafe-request-id"]
        provenance = answer.json()["x_provenance"]
        assert provenance["request_id"] == wanted
    assert [line["request_id"] for line in access_lines(caplog)] == ids


async def test_a_refused_caller_does_not_keep_its_request_id(client_factory, quick_engine, caplog):
    caplog.set_level(logging.INFO, logger="opendecide.access")
    async with client_factory(quick_engine, api_keys=[A]) as client:
        refused = await client.post("/v1/systemone", json=BODY, headers={"x-request-id": "trace-42"})
    assert refused.status_code == 401 and "trace-42" not in refused.headers["x-request-id"]
    assert [line["request_id"] for line in access_lines(caplog)] == [refused.headers["x-request-id"]]


@pytest.mark.parametrize(
    "given",
    ["x" * 129, "tab\there", "café-trace", "two words"],
)
async def test_a_request_id_that_is_too_long_or_not_printable_ascii_is_replaced(
    client_factory, quick_engine, given
):
    async with client_factory(quick_engine) as client:
        response = await client.get("/v1/models", headers={"x-request-id": given.encode("utf-8")})
        kept = await client.get("/v1/models", headers={"x-request-id": "x" * 128})
    assert response.status_code == 200 and given not in response.headers["x-request-id"]
    assert len(response.headers["x-request-id"]) == 32  # a server id
    assert kept.headers["x-request-id"] == "x" * 128


async def test_a_decision_id_is_bounded_and_never_echoed_whole(client_factory, quick_engine, tmp_path):
    from calibration.open import open_store

    store = open_store(tmp_path / "store.sqlite3")
    huge = "dec_" + "x" * 60_000  # within the feedback body limit (64 KiB)
    async with client_factory(quick_engine, store=store) as client:
        too_long = await client.post("/v1/feedback", json={"decision_id": huge, "gold": True})
        unknown = await client.post("/v1/feedback", json={"decision_id": "dec_" + "y" * 124, "gold": True})
    assert too_long.status_code == 422 and len(too_long.content) < 1000
    (item,) = too_long.json()["detail"]
    assert item["loc"] == ["body", "decision_id"] and "128" in item["msg"]
    assert unknown.status_code == 404 and len(unknown.content) < 400


async def test_tool_call_ids_are_bounded(client_factory, quick_engine):
    body = {
        "model": "smollm2-135m-instruct",
        "input": [
            {"role": "user", "content": "Where is order 17?"},
            {"type": "function_call", "call_id": "c" * 300, "name": "f", "arguments": "{}"},
        ],
        "questions": [{"type": "predicate", "instructions": "It is about an order."}],
    }
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/decisions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "input[1].call_id: String should have at most 128 characters" in error["message"]
    assert "c" * 129 not in response.text
