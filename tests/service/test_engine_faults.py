"""Engine faults map to 502/503/504 with a reason; no distribution is ever made up.

A function engine (named as such) injects faults a real engine cannot produce on demand; it uses
the embedded model's real tokenizer so prompts and labels are resolved as in production.
"""

from __future__ import annotations

import json

import httpx
import pytest

from readers.engines.base import Capabilities, EngineReply, ReadMode, ReadRequest
from readers.engines.vllm import VLLMEngine
from readers.errors import EngineBadReply, EngineTimeout, EngineUnavailable
from tests.service.support import function_engine, samples, value

pytestmark = pytest.mark.anyio

BODY = {
    "state": "The parcel never arrived.",
    "questions": {"late": {"type": "noul", "instructions": "Is the customer complaining?"}},
}


def raises(error):
    def fn(request: ReadRequest):
        raise error

    return fn


@pytest.mark.parametrize(
    "error, status, error_type",
    [
        (
            EngineUnavailable("engine at http://127.0.0.1:1 is unreachable", retry_after_s=7),
            503,
            "engine_unavailable",
        ),
        (EngineTimeout("engine did not answer in time"), 504, "engine_timeout"),
        (EngineBadReply("engine reply has no logprobs"), 502, "engine_bad_reply"),
    ],
)
async def test_engine_errors_keep_their_status_and_reason(
    client_factory, local_engine, error, status, error_type
):
    async with client_factory(function_engine(local_engine, raises(error))) as client:
        response = await client.post("/v1/systemone", json=BODY)
    assert response.status_code == status
    detail = response.json()["detail"]
    assert detail["error_type"] == error_type and detail["message"] == error.message
    if status == 503:
        assert response.headers["retry-after"] == "7"


async def test_an_unexpected_failure_is_a_json_500(local_engine):
    from service.app import create_app

    app = create_app(function_engine(local_engine, raises(RuntimeError("boom"))))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t"
    ) as client:
        response = await client.post("/v1/systemone", json=BODY)
    assert response.status_code == 500 and response.json()["detail"]["error_type"] == "internal_error"


async def test_reply_without_logprobs_is_a_502_not_a_guess(client_factory, local_engine):
    empty = lambda request: EngineReply({}, ReadMode.TOPK, len(request.prompt_ids), 1.0)  # noqa: E731
    async with client_factory(function_engine(local_engine, empty)) as client:
        response = await client.post("/v1/systemone", json=BODY)
    assert response.status_code == 502 and "no log-probs" in response.json()["detail"]["message"]


async def test_exact_reply_missing_a_label_is_a_502(client_factory, local_engine):
    def partial(request: ReadRequest) -> EngineReply:
        return EngineReply({request.label_ids[0]: -0.5}, ReadMode.EXACT, len(request.prompt_ids), 1.0)

    async with client_factory(function_engine(local_engine, partial, ReadMode.EXACT)) as client:
        response = await client.post("/v1/systemone", json=BODY)
    assert response.status_code == 502 and "missing label tokens" in response.json()["detail"]["message"]


async def test_no_label_in_the_top_k_is_an_uninformative_read_and_abstained(client_factory, local_engine):
    def elsewhere(request: ReadRequest) -> EngineReply:
        others = [token for token in range(100, 140) if token not in request.label_ids][:32]
        return EngineReply(
            {token: -1.0 - i * 0.1 for i, token in enumerate(others)},
            ReadMode.TOPK,
            len(request.prompt_ids),
            1.0,
        )

    body = {
        "state": "s",
        "questions": {
            "c": {"type": "choice", "criteria": {"positive": None, "negative": None}},
            "n": {"type": "noul", "instructions": "?"},
        },
    }
    async with client_factory(function_engine(local_engine, elsewhere)) as client:
        response = await client.post("/v1/systemone", json=body)
        found = samples((await client.get("/metrics")).text)
    assert response.status_code == 200
    assert all(a["x_reading"]["abstained"] for a in response.json()["answers"].values())
    assert value(found, "decide_abstentions_total", reason="uninformative_read") == 2
    assert (
        found[("decide_abstentions_total", (("reason", "low_confidence"),))] == 0
    )  # exported from the start
    noul = response.json()["answers"]["n"]
    assert (
        noul["noul"] == 0.5 and not noul["x_reading"]["informative"]
    )  # Jev's "uncertain", flagged as no read
    answer = response.json()["answers"]["c"]
    reading = answer["x_reading"]
    assert not reading["informative"] and reading["labels_returned"] == 0
    assert answer["confidence"] == 0.0
    assert reading["probability_bounds"] == {"positive": [0.0, 1.0], "negative": [0.0, 1.0]}
    assert reading["floor_logprob"] == pytest.approx(-1.0 - 31 * 0.1 - 5.0)


def vllm_engine(local_engine, reply):
    """The real vLLM engine client and reply parser, its HTTP answered by ``reply(request_json)``."""

    def handle(request: httpx.Request) -> httpx.Response:
        return reply(json.loads(request.content))

    client = httpx.AsyncClient(base_url="http://vllm.test", transport=httpx.MockTransport(handle))
    capabilities = Capabilities(
        read_mode=ReadMode.TOPK, max_logprobs=32, top_k=32, probe={"engine": "mock transport"}
    )
    return VLLMEngine(
        client,
        served_name="m",
        tokenizer=local_engine.tokenizer,
        info=local_engine.info,
        capabilities=capabilities,
    )


def completion(top: object, prompt_tokens=None):
    body = {"choices": [{"logprobs": {"top_logprobs": [top]}}]}
    if prompt_tokens is not None:
        body["usage"] = {"prompt_tokens": prompt_tokens}
    return httpx.Response(
        200, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )


MALFORMED = [
    ("no logprobs", lambda req: completion({}), "no log-probs"),
    ("no choices", lambda req: httpx.Response(200, json={"choices": []}), "no choices[0].logprobs"),
    ("top_logprobs not a mapping", lambda req: completion([["token_id:1", -0.1]]), "no choices[0].logprobs"),
    ("token text, not ids", lambda req: completion({"yes": -0.1}), "not a token id"),
    ("NaN log-prob", lambda req: completion({f"token_id:{req['prompt'][0]}": float("nan")}), "log-prob nan"),
    ("positive log-prob", lambda req: completion({"token_id:5": 3.0}), "log-prob 3.0"),
    ("infinite log-prob", lambda req: completion({"token_id:5": float("inf")}), "log-prob inf"),
    ("string log-prob", lambda req: completion({"token_id:5": "-0.1"}), "log-prob '-0.1'"),
    (
        "id the tokenizer lacks",
        lambda req: completion({"token_id:5": -0.1, "token_id:99999999": -0.2}),
        "outside the tokenizer",
    ),
    (
        "another model's prompt",
        lambda req: completion({"token_id:5": -0.1}, prompt_tokens=3),
        "counted 3 prompt tokens",
    ),
    ("HTML error page", lambda req: httpx.Response(200, text="<html>gateway</html>"), "non-JSON"),
    (
        "server error",
        lambda req: httpx.Response(500, json={"error": {"message": "CUDA OOM"}}),
        "answered /v1/completions with 500",
    ),
]


@pytest.mark.parametrize("name, reply, message", MALFORMED, ids=[case[0] for case in MALFORMED])
async def test_malformed_engine_replies_fail_closed_with_502(
    client_factory, local_engine, name, reply, message
):
    async with client_factory(vllm_engine(local_engine, reply)) as client:
        response = await client.post("/v1/systemone", json=BODY)
    assert response.status_code == 502, response.text
    detail = response.json()["detail"]
    assert detail["error_type"] == "engine_bad_reply" and message in detail["message"], detail
    assert "answers" not in response.text
