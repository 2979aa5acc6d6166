"""Google's official SDK (``google-genai`` 3.3.0), unchanged, against ``POST /v1beta/decisions``.

Real uvicorn servers on loopback ports. The decisions are read by the embedded model; the fault,
deadline and rate-limit servers use a function engine (named as such: it reaches no model) because
what they test is HTTP semantics: which status the SDK sees, which exception it raises, whether it
retries. The SDK's client is pointed at the server with its base URL alone, as a Gemini user would:
it then sends ``/v1/decisions`` (its default Gemini API version is ``v1``), OpenAI's path here, which
serves a request carrying Google's headers as ``/v1beta/decisions``
(``service/middleware/google_paths.py``); ``api_version="v1beta"`` reaches the route directly.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import httpx
import pytest
from google import genai
from google.genai import _interactions as gerrors
from google.genai import errors as genai_errors
from google.genai import types

from deploy.processes import serving
from readers.engines.base import ReadMode
from readers.errors import EngineUnavailable
from service.admission import AdmissionLimits
from service.app import create_app
from tests.service.support import calibrated_store, favour_first, function_engine

pytestmark = [pytest.mark.integration, pytest.mark.anyio]  # real uvicorn servers on loopback ports

KEY = "od-test-key-0123456789abcdef"
CALIBRATE_ONLY = "od-test-key-calibrate-0123456789"
REVIEW = "Great phone, the screen is bright and the battery lasts all day."
MODEL = "models/gemini-decision-1"
SENTIMENT = {
    "type": "choice",
    "instructions": "What is the sentiment of this review?",
    "criteria": {"positive": "", "negative": "", "neutral": ""},
}
RPC = "type.googleapis.com/google.rpc."


KEPT: list[genai.Client] = []


def google(url: str, *, key: str = KEY, attempts: int = 1, api_version: str | None = None) -> genai.Client:
    """The SDK's client for ``url``; ``attempts`` counts the first request (1: no retries). Kept for
    the module's run: the SDK closes its HTTP client when the ``Client`` is collected, which for a
    client made inline (``google(url).decisions.create(…)``) is before its own request is sent."""
    options = types.HttpOptions(
        base_url=url, api_version=api_version, retry_options=types.HttpRetryOptions(attempts=attempts)
    )
    KEPT.append(genai.Client(api_key=key, http_options=options))
    return KEPT[-1]


def details(error) -> dict[str, dict]:
    """An SDK error's ``google.rpc`` details by type name."""
    return {item["@type"].removeprefix(RPC): item for item in error.body["error"]["details"]}


@pytest.fixture(scope="module")
def store(local_engine, tmp_path_factory):
    return calibrated_store(local_engine, tmp_path_factory.mktemp("calibrations") / "c.sqlite3")


@pytest.fixture(scope="module")
def live(local_engine, store):
    app = create_app(local_engine, api_keys=[KEY, f"{CALIBRATE_ONLY} scopes=calibrate"], store=store)
    with serving(app) as url:
        yield url


@pytest.fixture
def client(live):
    return google(live)


def test_three_question_types_legend_confidence_and_usage(client):
    decision = client.decisions.create(
        model=MODEL,
        input=REVIEW,
        questions={
            "likes": {"type": "noul", "instructions": "The reviewer likes the phone.",
                      "criteria": {"true_description": "they like it", "false_description": "they do not"}},
            "sentiment": SENTIMENT | {"criteria": {"positive": "glad", "negative": "", "neutral": "flat"}},
            "stars": {"type": "score", "instructions": "How positive is it?", "criteria": ["bad", "fine", "great"]},
        },
    )  # fmt: skip
    likes, sentiment, stars = (decision.answers[name] for name in ("likes", "sentiment", "stars"))
    assert likes.type == "noul" and 0 < likes.noul < 1
    assert likes.confidence == pytest.approx(max(likes.noul, 1 - likes.noul), abs=1e-12)
    assert sentiment.type == "choice" and set(sentiment.probabilities) == {"positive", "negative", "neutral"}
    assert math.isclose(sum(sentiment.probabilities.values()), 1.0, rel_tol=1e-9)
    assert sentiment.choice == max(sentiment.probabilities, key=sentiment.probabilities.get)
    assert sentiment.confidence == pytest.approx(sentiment.probabilities[sentiment.choice], abs=1e-12)
    assert stars.type == "score" and stars.legend == {"0": "bad", "1": "fine", "2": "great"}
    assert list(stars.probabilities) == ["0", "1", "2"]
    assert stars.score == pytest.approx(sum(int(k) * p for k, p in stars.probabilities.items()), abs=1e-9)
    assert stars.confidence == pytest.approx(max(stars.probabilities.values()), abs=1e-12)
    assert decision.prompt_feedback is None
    # Usage from the readings' own counts: the three prompts, and the state computed once for them.
    readings = [decision.answers[name].x_reading for name in ("likes", "sentiment", "stars")]
    usage = decision.usage
    assert usage.total_input_tokens == sum(r["prompt_tokens"] for r in readings)
    assert usage.total_cached_tokens == sum(
        max(0, r["prompt_tokens"] - r["tokens_computed"]) for r in readings
    )
    assert usage.total_cached_tokens > 0  # three questions about one state
    assert usage.total_output_tokens == 3 and usage.total_tokens == usage.total_input_tokens + 3
    assert usage.input_tokens_by_modality[0].modality == "text"


def test_text_parts_are_the_state_as_their_joined_text(client):
    asked = {"q": {"type": "noul", "instructions": [{"type": "text", "text": "It is a review."}]}}
    parts = client.decisions.create(
        model=MODEL,
        input=[{"type": "text", "text": "Great phone."}, {"type": "text", "text": "Battery lasts all day."}],
        questions=asked,
    )
    joined = client.decisions.create(
        model=MODEL, input="Great phone.\nBattery lasts all day.", questions=asked
    )
    one = client.decisions.create(
        model=MODEL, input={"type": "text", "text": "Great phone."}, questions=asked
    )
    # One prompt: the same tokens read (the first read computes afresh and the second reuses the
    # kept prefix, which rounds differently in the last digits).
    assert parts.answers["q"].x_reading["prompt_tokens"] == joined.answers["q"].x_reading["prompt_tokens"]
    assert parts.answers["q"].noul == pytest.approx(joined.answers["q"].noul, abs=1e-4)
    assert one.answers["q"].type == "noul"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image", "uri": "gs://bucket/a.png", "mime_type": "image/png"},
        {"type": "audio", "data": "AAAA", "mime_type": "audio/wav"},
        {"type": "video", "uri": "gs://bucket/a.mp4"},
        {"type": "document", "uri": "gs://bucket/a.pdf", "mime_type": "application/pdf"},
    ],
    ids=lambda part: part["type"],
)
def test_a_non_text_part_is_refused_naming_it_and_its_index(client, part):
    with pytest.raises(gerrors.BadRequestError) as raised:
        client.decisions.create(
            model=MODEL,
            input=[{"type": "text", "text": REVIEW}, part],
            questions={"q": {"type": "noul", "instructions": "x"}},
        )
    error = raised.value.body["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert f"input[1]: {part['type']} parts are not supported" in error["message"]
    found = details(raised.value)
    assert found["ErrorInfo"]["reason"] == "unsupported_feature"
    assert found["BadRequest"]["fieldViolations"][0]["field"] == "input[1]"


async def test_the_async_client(live):
    decision = await google(live).aio.decisions.create(
        model="models/jev-latest",
        input=REVIEW,
        questions={"r": {"type": "noul", "instructions": "It is a review."}},
    )
    assert decision.answers["r"].type == "noul" and 0 < decision.answers["r"].noul < 1


async def test_the_async_client_raises_typed_errors(live):
    with pytest.raises(gerrors.NotFoundError):
        await google(live).aio.decisions.create(
            model="models/gemini-2.5-pro",
            input=REVIEW,
            questions={"r": {"type": "noul", "instructions": "x"}},
        )


def test_all_three_routes_give_the_same_probabilities(client, live):
    headers = {"Authorization": f"Bearer {KEY}"}
    jev_body = {"state": REVIEW, "questions": {"s": {"type": "choice", "instructions": SENTIMENT["instructions"],
                "criteria": {"positive": None, "negative": None, "neutral": None}}}}  # fmt: skip
    openai_body = {
        "model": "gpt-6-luna",
        "input": REVIEW,
        "questions": [{"type": "choice", "instructions": SENTIMENT["instructions"],
                       "choices": [{"value": "positive"}, {"value": "negative"}, {"value": "neutral"}]}],
    }  # fmt: skip

    def ask_jev():
        response = httpx.post(f"{live}/v1/systemone", headers=headers, json=jev_body, timeout=120)
        return response.json()["answers"]["s"]

    # The embedded engine computes a prompt's first read afresh and later ones from its kept keys and
    # values, which round differently (~1e-8): the routes are compared on kept reads.
    ask_jev()
    jev = ask_jev()
    openai = httpx.post(f"{live}/v1/decisions", headers=headers, json=openai_body, timeout=120).json()
    openai_probabilities = {p["value"]: p["probability"] for p in openai["answers"][0]["probabilities"]}
    answer = client.decisions.create(model=MODEL, input=REVIEW, questions={"s": SENTIMENT}).answers["s"]
    assert answer.x_reading["calibration"] is not None
    assert answer.x_reading["calibration"]["id"] == jev["x_reading"]["calibration"]["id"]
    assert answer.x_reading["prior_correction"] == jev["x_reading"]["prior_correction"]
    for option, probability in answer.probabilities.items():
        assert abs(probability - jev["probabilities"][option]) < 1e-9
        assert abs(probability - openai_probabilities[option]) < 1e-9
    assert answer.choice == jev["choice"] == openai["answers"][0]["choice"]


def test_the_sdks_default_version_and_v1beta_answer_alike_and_openai_keeps_v1(live):
    """The SDK with its base URL alone sends /v1/decisions: served as Google's route (its headers say
    who sends it), the same answer as api_version="v1beta"; an OpenAI body there with a Bearer key is
    still OpenAI's route, and Google's /v1/models is Google's list."""
    question = {"r": {"type": "noul", "instructions": "It is a review."}}
    default = google(live).decisions.create(model=MODEL, input=REVIEW, questions=question)
    beta = google(live, api_version="v1beta").decisions.create(model=MODEL, input=REVIEW, questions=question)
    assert default.answers["r"].noul == pytest.approx(beta.answers["r"].noul, abs=1e-9)
    openai_body = {"model": "gpt-6-luna", "input": REVIEW, "questions": [{"type": "predicate", "instructions": "It is a review."}]}  # fmt: skip
    openai = httpx.post(
        f"{live}/v1/decisions", headers={"Authorization": f"Bearer {KEY}"}, json=openai_body, timeout=120
    )
    assert openai.status_code == 200 and openai.json()["answers"][0]["type"] == "predicate"
    listed = httpx.get(f"{live}/v1/models", headers={"x-goog-api-key": KEY}, timeout=30).json()
    assert listed["models"][0]["name"].startswith("models/")


@pytest.mark.slow
@pytest.mark.alone  # ~34 s of the 60 s deadline on 2 idle cores; beside another worker it can pass 60 s
def test_1000_questions_in_one_request_are_answered_under_the_default_limits(live):
    """The default admission limits and 60 s deadline: on two CPU cores the embedded model answers
    the 1,000 questions in about 30 s, since the state is computed once and each question adds only
    its own ~14 tokens."""
    client = google(live)
    questions = {
        f"q{i}": {"type": "noul", "instructions": f"The review mentions feature number {i}."}
        for i in range(1000)
    }
    started = time.monotonic()
    decision = client.decisions.create(model=MODEL, input=REVIEW, questions=questions)
    elapsed = time.monotonic() - started
    assert set(decision.answers) == set(questions) and all(
        a.type == "noul" for a in decision.answers.values()
    )
    # The state was computed once, not 1,000 times: most input tokens are reported as cached.
    assert decision.usage.total_cached_tokens > decision.usage.total_input_tokens / 3
    print(f"1,000 questions answered in {elapsed:.1f} s")


def test_the_models_list_and_one_model(client, local_engine):
    names = [model.name for model in client.models.list()]
    assert names[0] == f"models/{local_engine.info.name}" and MODEL in names and "models/jev-1.14.0" in names
    model = client.models.get(model="gemini-decision-1")
    assert model.name == MODEL and model.input_token_limit == local_engine.info.context_length
    assert model.supported_actions == ["createDecision"]
    with pytest.raises(genai_errors.ClientError) as raised:
        client.models.get(model="gemini-2.5-pro")
    assert raised.value.code == 404 and raised.value.status == "NOT_FOUND"


BAD_REQUESTS = [
    # (what is wrong, the request's fields, the field the error names)
    ("no questions", {"questions": {}}, "questions"),
    ("1,001 questions", {"questions": {f"q{i}": {"type": "noul", "instructions": "x"} for i in range(1001)}}, "questions"),
    ("duplicate options after NFKC", {"questions": {"c": {"type": "choice", "instructions": "x", "criteria": {"A": "", "\uff21": ""}}}}, "questions.c.criteria"),
    ("look-alike option ids across scripts", {"questions": {"c": {"type": "choice", "instructions": "x", "criteria": {"yes": "", "y\u0435s": ""}}}}, "questions.c.criteria"),
    ("duplicate levels", {"questions": {"s": {"type": "score", "instructions": "x", "criteria": ["bad", "good", "bad"]}}}, "questions.s.criteria"),
    ("an option id with a space around it", {"questions": {"c": {"type": "choice", "instructions": "x", "criteria": {" a": "", "b": ""}}}}, "questions.c.criteria"),
    ("a one-option choice", {"questions": {"c": {"type": "choice", "instructions": "x", "criteria": {"a": ""}}}}, "questions.c.criteria"),
    ("a score of 11 levels", {"questions": {"s": {"type": "score", "instructions": "x", "criteria": [str(i) for i in range(11)]}}}, "questions.s.criteria"),
    ("an empty level", {"questions": {"s": {"type": "score", "instructions": "x", "criteria": ["a", " "]}}}, "questions.s.criteria"),
    ("no instruction parts", {"questions": {"n": {"type": "noul", "instructions": []}}}, "questions.n.instructions"),
]  # fmt: skip


@pytest.fixture(scope="module")
def quick(local_engine):
    """A server over a function engine: for refusals that come before any read."""
    with serving(create_app(function_engine(local_engine, favour_first))) as url:
        yield url


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS])
def test_bad_input_raises_bad_request_naming_the_field(quick, case):
    _, fields, field = case
    request = {"model": MODEL, "input": REVIEW, "questions": {"q": {"type": "noul", "instructions": "x"}}}
    with pytest.raises(gerrors.BadRequestError) as raised:
        google(quick).decisions.create(**{**request, **fields})
    assert raised.value.body["error"]["status"] == "INVALID_ARGUMENT"
    assert details(raised.value)["BadRequest"]["fieldViolations"][0]["field"] == field, raised.value.body


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(gerrors.NotFoundError) as raised:
        client.decisions.create(
            model="models/gemini-2.5-pro",
            input=REVIEW,
            questions={"q": {"type": "noul", "instructions": "x"}},
        )
    error = raised.value.body["error"]
    assert error["status"] == "NOT_FOUND" and "gemini-2.5-pro" in error["message"]
    assert details(raised.value)["ErrorInfo"]["reason"] == "unknown_model"


def test_a_wrong_key_is_unauthenticated(live):
    with pytest.raises(gerrors.AuthenticationError) as raised:
        google(live, key="not-a-key-0123456789").decisions.create(
            model=MODEL, input=REVIEW, questions={"q": {"type": "noul", "instructions": "x"}}
        )
    assert raised.value.body["error"]["status"] == "UNAUTHENTICATED"


def test_a_key_without_the_decide_scope_is_permission_denied(live):
    with pytest.raises(gerrors.PermissionDeniedError) as raised:
        google(live, key=CALIBRATE_ONLY).decisions.create(
            model=MODEL, input=REVIEW, questions={"q": {"type": "noul", "instructions": "x"}}
        )
    assert raised.value.body["error"]["status"] == "PERMISSION_DENIED"


def test_the_google_key_header_is_accepted_on_every_route(live):
    headers = {"x-goog-api-key": KEY}
    assert httpx.get(f"{live}/v1/models", headers=headers).status_code == 200
    jev = {"state": REVIEW, "questions": {"q": {"type": "noul", "instructions": "It is a review."}}}
    assert httpx.post(f"{live}/v1/systemone", headers=headers, json=jev, timeout=60).status_code == 200
    assert (
        httpx.get(f"{live}/v1/models", headers={"x-goog-api-key": "wrong-key-0123456789"}).status_code == 401
    )


def test_an_input_longer_than_the_context_is_invalid_argument_naming_it(client, local_engine):
    text = "word " * (local_engine.info.context_length + 10)
    with pytest.raises(gerrors.BadRequestError) as raised:
        client.decisions.create(
            model=MODEL, input=text, questions={"q": {"type": "noul", "instructions": "x"}}
        )
    assert details(raised.value)["ErrorInfo"]["reason"] == "prompt_too_long"


DECISION_PATHS = ("/v1/decisions", "/v1beta/decisions")


class StatusRecorder:
    """The statuses a wrapped app answered Google's decisions with (``/v1/decisions`` as the SDK sends
    it by default, or ``/v1beta/decisions``), in order (composition, not patching); ``on_status`` is
    told each one as it is sent."""

    def __init__(self, app, on_status=lambda status: None) -> None:
        self.app = app
        self.statuses: list[int] = []
        self.on_status = on_status

    async def __call__(self, scope, receive, send):
        async def record(message):
            if message["type"] == "http.response.start" and scope["path"] in DECISION_PATHS:
                self.statuses.append(message["status"])
                self.on_status(message["status"])
            await send(message)

        await self.app(scope, receive, record)


REQUEST = {"model": MODEL, "input": REVIEW, "questions": {"q": {"type": "noul", "instructions": "x"}}}


def test_a_bad_request_is_not_retried(local_engine):
    app = StatusRecorder(create_app(function_engine(local_engine, favour_first)))
    with serving(app) as url:
        with pytest.raises(gerrors.BadRequestError):
            google(url, attempts=3).decisions.create(**{**REQUEST, "questions": {}})
    assert app.statuses == [400]


def test_a_429_is_resource_exhausted_with_retry_info_and_retried_after_retry_after(local_engine):
    # One request per second, a burst of 1: the second is refused with Retry-After: 1, which the SDK
    # waits out and retries.
    app = StatusRecorder(create_app(function_engine(local_engine, favour_first), rate_limit=(1.0, 1)))
    with serving(app) as url:
        google(url).decisions.create(**REQUEST)
        started = time.monotonic()
        assert google(url, attempts=3).decisions.create(**REQUEST).answers["q"].type == "noul"
        elapsed = time.monotonic() - started
        with pytest.raises(gerrors.RateLimitError) as raised:
            google(url).decisions.create(**REQUEST)
    assert app.statuses[:3] == [200, 429, 200] and elapsed >= 0.9, (app.statuses, elapsed)
    assert raised.value.body["error"]["status"] == "RESOURCE_EXHAUSTED"
    retry_after = raised.value.response.headers["retry-after"]
    assert details(raised.value)["RetryInfo"]["retryDelay"] == f"{retry_after}s"


def test_an_engine_fault_is_unavailable(local_engine):
    def down(request):
        raise EngineUnavailable("the engine is down", retry_after_s=1)

    with serving(create_app(function_engine(local_engine, down))) as url:
        with pytest.raises(gerrors.InternalServerError) as raised:
            google(url).decisions.create(**REQUEST)
    assert raised.value.status_code == 503 and raised.value.body["error"]["status"] == "UNAVAILABLE"
    assert details(raised.value)["RetryInfo"]["retryDelay"] == "1s"


def test_the_servers_deadline_is_deadline_exceeded(local_engine):
    async def slow(request):
        await asyncio.sleep(5)
        return favour_first(request)

    limits = AdmissionLimits(deadline_s=0.3)
    with serving(create_app(function_engine(local_engine, slow, ReadMode.EXACT), admission=limits)) as url:
        with pytest.raises(gerrors.InternalServerError) as raised:
            google(url).decisions.create(**REQUEST)
    assert raised.value.status_code == 504 and raised.value.body["error"]["status"] == "DEADLINE_EXCEEDED"
    assert details(raised.value)["ErrorInfo"]["reason"] == "deadline_exceeded"


def test_a_full_queue_is_unavailable_and_the_sdk_retries_it(local_engine):
    """The admission queue's 529 is 503 UNAVAILABLE here, with Retry-After, which the SDK waits out:
    one request in flight and one at the head of the queue, the held ones released when the third's
    503 is sent, and the SDK's retry a second later is answered."""
    reading, gate = threading.Event(), threading.Event()

    async def held(request):
        reading.set()
        await asyncio.to_thread(gate.wait, 60)
        return favour_first(request)

    limits = AdmissionLimits(in_flight_cost=1, queued_cost=1, retry_after_s=1)
    engine = function_engine(local_engine, held, ReadMode.EXACT)
    app = StatusRecorder(create_app(engine, admission=limits), on_status=lambda s: s == 503 and gate.set())
    with serving(app) as url:
        first = google(url)
        holders = [
            threading.Thread(target=first.decisions.create, kwargs={**REQUEST, "input": state})
            for state in ("first", "second")
        ]
        holders[0].start()
        assert reading.wait(30)
        holders[1].start()
        time.sleep(1.0)  # the second is parsed and waits at the head of the queue
        started = time.monotonic()
        decision = google(url, attempts=3).decisions.create(**{**REQUEST, "input": "third"})
        elapsed = time.monotonic() - started
        for holder in holders:
            holder.join(timeout=30)
    assert decision.answers["q"].type == "noul"
    assert app.statuses[0] == 503 and sorted(app.statuses[1:]) == [200, 200, 200]
    assert elapsed >= 0.9  # Retry-After: 1 was waited out, not the SDK's own sub-second backoff
