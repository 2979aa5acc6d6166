"""x_debias, x_rotations and x_min_confidence over HTTP on the embedded model: answers, 422s, metric."""

from __future__ import annotations

import pytest

from service.pipeline.abstain import abstains
from service.pipeline.confidence import answer_confidence
from tests.service.support import samples, value

pytestmark = pytest.mark.anyio

STATE = "Shares of the chip maker rose 4% after it raised its yearly sales forecast."
TOPIC = {
    "type": "choice",
    "instructions": "What is the topic?",
    "criteria": {"World": None, "Sports": None, "Business": None, "Sci/Tech": None},
}


def body(**extensions) -> dict:
    return {"state": STATE, "questions": {"topic": {**TOPIC, **extensions}}}


@pytest.mark.slow  # every rotation setting read
async def test_named_options_are_read_once_whatever_the_rotations_asked(client_factory, local_engine):
    """Since decide-prompt/3 named options are not listed in the prompt, so every order is the same
    prompt: x_debias reads it once and says so (rotations 1). Rotated reads of listed options (letter
    codes) are tested in tests/readers/test_debias.py."""
    async with client_factory(local_engine) as client:
        plain = (await client.post("/v1/systemone", json=body())).json()
        rotated = (await client.post("/v1/systemone", json=body(x_debias="rotate"))).json()
    assert (
        plain["answers"]["topic"]["x_reading"]["rotations"] == 1
        and plain["answers"]["topic"]["x_reading"]["rotation_agreement"] is None
    )
    reading = rotated["answers"]["topic"]["x_reading"]
    assert reading["rotations"] == 1 and reading["rotation_agreement"] is None
    assert rotated["usage"]["input_tokens"] == plain["usage"]["input_tokens"]
    assert rotated["answers"]["topic"]["probabilities"] == pytest.approx(
        plain["answers"]["topic"]["probabilities"], abs=1e-4
    )


@pytest.mark.parametrize(
    ("question", "field", "message"),
    [
        ({**TOPIC, "x_min_confidence": 1.5}, "x_min_confidence", "less than or equal to 1"),
        ({**TOPIC, "x_min_confidence": -0.1}, "x_min_confidence", "greater than or equal to 0"),
        (
            {**TOPIC, "x_min_confidence": False},
            "x_min_confidence",
            "valid number",
        ),  # a bool is not a number (not 0.0)
        ({**TOPIC, "x_debias": "rotate", "x_rotations": "3"}, "x_rotations", "valid integer"),  # nor a string
        ({**TOPIC, "x_rotations": 2}, "x_rotations", "needs x_debias"),
        ({**TOPIC, "x_debias": "rotate", "x_rotations": 5}, "x_rotations", "reads at most 4 orders"),
        ({**TOPIC, "x_debias": "rotate_reverse", "x_rotations": 9}, "x_rotations", "reads at most 8 orders"),
        ({**TOPIC, "x_debias": "rotate", "x_rotations": 1}, "x_rotations", "greater than or equal to 2"),
        ({**TOPIC, "x_debias": "shuffle"}, "x_debias", "'rotate' or 'rotate_reverse'"),
        (
            {"type": "score", "criteria": ["low", "high"], "x_debias": "rotate"},
            "x_debias",
            "levels are ordered",
        ),
    ],
)
async def test_bad_read_options_are_a_422_naming_the_field(
    client_factory, quick_engine, question, field, message
):
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json={"state": STATE, "questions": {"q": question}})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"][-1] == field and message in error["msg"]


@pytest.mark.slow  # three requests read at each threshold
async def test_below_the_minimum_confidence_the_answer_abstains_and_keeps_its_fields(
    client_factory, local_engine
):
    async with client_factory(local_engine) as client:
        free = (await client.post("/v1/systemone", json=body())).json()["answers"]["topic"]
        confidence = free["confidence"]
        assert 0 < confidence < 0.99 and free["x_reading"]["abstained"] is False
        above = (await client.post("/v1/systemone", json=body(x_min_confidence=confidence + 0.01))).json()[
            "answers"
        ]["topic"]
        below = (await client.post("/v1/systemone", json=body(x_min_confidence=confidence - 0.01))).json()[
            "answers"
        ]["topic"]
        found = samples((await client.get("/metrics")).text)
    assert above["x_reading"]["abstained"] is True and below["x_reading"]["abstained"] is False
    for field in ("choice", "confidence", "probabilities"):
        assert above[field] == below[field] == free[field]
    assert value(found, "decide_abstentions_total", reason="low_confidence") == 1


async def test_noul_abstains_on_the_two_option_confidence(client_factory, local_engine):
    question = {"type": "noul", "instructions": "Is this about the stock market?"}
    async with client_factory(local_engine) as client:
        noul = (
            await client.post("/v1/systemone", json={"state": STATE, "questions": {"q": question}})
        ).json()["answers"]["q"]["noul"]
        confidence = abs(2 * noul - 1)
        asked = {
            "state": STATE,
            "questions": {"q": {**question, "x_min_confidence": min(1.0, confidence + 0.01)}},
        }
        answer = (await client.post("/v1/systemone", json=asked)).json()["answers"]["q"]
    # The second read reuses the first one's keys and values: equal to float rounding.
    assert answer["x_reading"]["abstained"] is True and answer["noul"] == pytest.approx(noul, abs=1e-5)


def test_answer_confidence_is_jevs():
    assert answer_confidence("choice", {"a": 0.8, "b": 0.1, "c": 0.1}) == pytest.approx(0.7)
    assert answer_confidence("noul", {"true": 0.2, "false": 0.8}) == pytest.approx(0.6)
    assert answer_confidence("score", {"0": 0.0, "1": 1.0, "2": 0.0}) == 1.0
    assert answer_confidence("choice", {"a": 0.9, "b": 0.1}, informative=False) == 0.0
    assert abstains(
        "choice", {"a": 0.5, "b": 0.5}, informative=False, min_confidence=None
    )  # no label came back
    assert not abstains("choice", {"a": 0.7, "b": 0.3}, informative=True, min_confidence=0.2)
    assert abstains("choice", {"a": 0.55, "b": 0.45}, informative=True, min_confidence=0.2)


async def test_a_batch_counts_rotations_against_its_read_limit(client_factory, quick_engine):
    question = {**TOPIC, "criteria": {f"o{i}": None for i in range(6)}}
    states = ["x"] * 700  # 700 reads as asked, 4,200 with six rotations each
    async with client_factory(quick_engine) as client:
        rotated = await client.post(
            "/decide/batch", json={"states": states, "questions": {"q": {**question, "x_debias": "rotate"}}}
        )
        small = await client.post(
            "/decide/batch",
            json={"states": ["a", "b"], "questions": {"q": {**question, "x_debias": "rotate"}}},
        )
    assert rotated.status_code == 422 and "got 4200" in rotated.text
    assert small.status_code == 200
    # The limit counts the orders asked for, before any prompt is built; named options then read once.
    assert [result["answers"]["q"]["x_reading"]["rotations"] for result in small.json()["results"]] == [1, 1]
