"""Input hygiene: what JSON can spell but no reader can use is a 422 naming the field, never a 500.

Raw bytes are sent where the JSON matters (NaN, lone surrogates), since a client library would refuse
to produce them; these are what the probes sent.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import uvicorn

from service.app import create_app

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}
NOUL = '{"type": "noul", "instructions": "Is it spam?"}'


def raw(text: str) -> bytes:
    return text.encode("utf-8")


CASES = [
    ("NaN in a state object", '{"state": {"score": NaN}, "questions": {"q": %s}}' % NOUL, ["body", "state", "score"], "NaN and Infinity"),
    ("Infinity in a description", '{"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": null, "b": {"w": Infinity}}}}}',
     ["body", "questions", "q", "criteria", "b", "w"], "NaN and Infinity"),
    ("-Infinity in a list", '{"state": [1, -Infinity], "questions": {"q": %s}}' % NOUL, ["body", "state", 1], "NaN and Infinity"),
    ("a number too large for a float", '{"state": {"n": 1e400}, "questions": {"q": %s}}' % NOUL, ["body", "state", "n"], "NaN and Infinity"),
    ("NaN as the model", '{"model": NaN, "state": "s", "questions": {"q": %s}}' % NOUL, ["body", "model"], "NaN and Infinity"),
    ("lone surrogate in the state", '{"state": "abc \\ud800 def", "questions": {"q": %s}}' % NOUL, ["body", "state"], "lone UTF-16 surrogate"),
    ("lone surrogate in an option name", '{"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a\\udc00": null, "b": null}}}}',
     ["body", "questions", "q", "criteria"], "lone UTF-16 surrogate"),
    ("lone surrogate in a question name", '{"state": "s", "questions": {"q\\ud800": %s}}' % NOUL, ["body", "questions"], "lone UTF-16 surrogate"),
    ("lone surrogate in instructions", '{"state": "s", "questions": {"q": {"type": "noul", "instructions": "\\udfff?"}}}',
     ["body", "questions", "q", "instructions"], "lone UTF-16 surrogate"),
]  # fmt: skip


@pytest.mark.parametrize("name, body, loc, message", CASES, ids=[case[0] for case in CASES])
async def test_unusable_json_values_are_a_422_naming_the_field(
    client_factory, quick_engine, name, body, loc, message
):
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", content=raw(body), headers=JSON)
    assert response.status_code == 422, response.text
    (item,) = response.json()["detail"]
    assert item["loc"] == loc and message in item["msg"]
    assert set(item) == {"loc", "msg", "type"}  # no `input`: nothing of the request is echoed


async def test_a_paired_surrogate_is_an_ordinary_character(client_factory, quick_engine):
    body = '{"state": "I love it \\ud83d\\ude00", "questions": {"q\\ud83d\\ude00": %s}}' % NOUL
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", content=raw(body), headers=JSON)
    assert response.status_code == 200 and list(response.json()["answers"]) == ["q\U0001f600"]


async def test_options_equal_after_nfc_normalisation_are_one_option_twice(client_factory, quick_engine):
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    body = {
        "state": "s",
        "questions": {"q": {"type": "choice", "criteria": {composed: None, decomposed: None}}},
    }
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert (
        item["loc"] == ["body", "questions", "q", "choice", "criteria"] and "duplicate options" in item["msg"]
    )


async def test_validation_errors_never_echo_the_state(client_factory, quick_engine):
    body = {
        "state": 12345.5,
        "questions": {"q": {"type": "noul", "instructions": "?", "criteria": "TOP-SECRET-STATE"}},
    }
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert (
        response.status_code == 422
        and "TOP-SECRET-STATE" not in response.text
        and "12345.5" not in response.text
    )


@pytest.mark.parametrize(
    "content_type, status",
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        (None, 415),
        ("application/json; charset=latin-1", 415),
        ("application/json; charset=utf-8", 200),
        ("application/vnd.decide+json", 200),
        ("Application/JSON", 200),
    ],
)
async def test_bodies_must_be_json(client_factory, quick_engine, content_type, status):
    body = json.dumps({"state": "s", "questions": {"q": json.loads(NOUL)}}).encode()
    headers = {"content-type": content_type} if content_type else {}
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", content=body, headers=headers)
    assert response.status_code == status, response.text
    if status == 415:
        detail = response.json()["detail"]
        assert detail["error_type"] == "unsupported_media_type" and "application/json" in detail["message"]
        assert detail["param"] == "Content-Type"


async def test_a_body_shorter_than_its_content_length_times_out_with_408(quick_engine):
    """A raw socket promises 1,000 bytes and sends 20: the server answers 408 at the body timeout."""
    app = create_app(quick_engine, body_timeout_s=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(
            b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        writer.write(b'{"state": "only so m')
        await writer.drain()
        started = asyncio.get_running_loop().time()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        waited = asyncio.get_running_loop().time() - started
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        detail = json.loads(await reader.readexactly(length))["detail"]
        writer.close()
    finally:
        server.should_exit = True
        await serving
    assert head.startswith(b"HTTP/1.1 408") and 0.4 < waited < 5
    assert detail["error_type"] == "request_timeout" and "0.5 s" in detail["message"]
