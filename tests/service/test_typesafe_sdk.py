"""The official TypeSafe SDK, pointed at this server by TYPESAFE_BASE_URL, works unchanged.

A real uvicorn server on a loopback port, the real embedded model, the SDK's default zstd body
compression. A recording wrapper (composition, not patching) notes each request's encoding.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from service.app import create_app
from tests.tools import require_module

typesafe_sdk = require_module("typesafe_sdk")

pytestmark = pytest.mark.integration  # a real uvicorn server on a loopback port
SDK_KEY = "od-test-key-0123456789abcdef"


class EncodingRecorder:
    def __init__(self, app) -> None:
        self.app = app
        self.encodings: list[str | None] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/systemone":
            headers = dict(scope["headers"])
            self.encodings.append(headers.get(b"content-encoding", b"").decode() or None)
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def live_server(local_engine):
    recorder = EncodingRecorder(create_app(local_engine, api_keys=[SDK_KEY]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(recorder, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", recorder
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def sdk_client(live_server, monkeypatch):
    url, _ = live_server
    monkeypatch.setenv("TYPESAFE_BASE_URL", url)  # how a Jev user points the SDK elsewhere
    monkeypatch.setenv("TYPESAFE_API_KEY", SDK_KEY)  # sent as Authorization: Bearer, which the server checks
    # A long state × 3 questions on shared CI cores can take longer than the SDK's default timeout.
    with typesafe_sdk.TypeSafeClient(timeout=120) as client:
        yield client


LONG_STATE = "Customer writes: I was charged twice for order 5531 and nobody answers my emails. " * 20


def test_noul_choice_and_score_through_the_sdk(sdk_client, live_server, local_engine):
    _, recorder = live_server
    before = len(recorder.encodings)
    result = sdk_client.system_one(
        state=LONG_STATE,
        questions={
            "billing": typesafe_sdk.Noul(instructions="Is this about billing?"),
            "tone": typesafe_sdk.Choice(
                instructions="What is the tone?", criteria={"calm": None, "angry": "upset or hostile"}
            ),
            "urgency": typesafe_sdk.Score(
                instructions="How urgent is it?", criteria=["can wait", "this week", "today"]
            ),
        },
    )
    assert recorder.encodings[before:] == ["zstd"]
    assert result.model == local_engine.info.name
    assert 0.0 <= result.nouls["billing"].noul <= 1.0
    tone = result.choices["tone"]
    assert tone.choice in {"calm", "angry"} and sum(tone.probabilities.values()) == pytest.approx(1.0)
    urgency = result.scores["urgency"]
    assert set(urgency.probabilities) == {0, 1, 2} and urgency.legend[2] == "today"
    assert urgency.score == pytest.approx(sum(level * p for level, p in urgency.probabilities.items()))
    assert result.usage.input_tokens > 0 and result.usage.output_tokens == 3
    assert result.request_id


def test_sdk_lists_models(sdk_client, local_engine):
    models = sdk_client.models.list().models
    assert [model.name for model in models] == [local_engine.info.name]


def test_sdk_raises_the_validation_error(sdk_client):
    with pytest.raises(typesafe_sdk.TypeSafeUnprocessableEntityError) as raised:
        sdk_client.system_one(
            state="s", questions={"q": {"type": "score", "instructions": "?", "criteria": ["one"]}}
        )
    assert "questions.q.score.criteria" in str(raised.value)


def test_sdk_with_a_wrong_key_gets_its_authentication_error(live_server, monkeypatch):
    url, _ = live_server
    monkeypatch.setenv("TYPESAFE_BASE_URL", url)
    with typesafe_sdk.TypeSafeClient(api_key="od-wrong-key-0123456789abcdef") as client:
        with pytest.raises(typesafe_sdk.TypeSafeAuthenticationError) as raised:
            client.models.list()
    assert raised.value.status == 401 and "invalid API key" in str(raised.value)
    assert raised.value.body["detail"]["error_type"] == "authentication_error"
