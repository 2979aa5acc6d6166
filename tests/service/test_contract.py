"""The wire contract Jev clients were written against: unknown top-level fields ignored, our
extensions under ``x_`` names, ``confidence`` by Jev's formula (the top probability in ``x_reading``)."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.anyio

QUESTIONS = {
    "tone": {
        "type": "choice",
        "instructions": "Tone?",
        "criteria": {"angry": None, "calm": None, "excited": None},
    },
    "spam": {"type": "noul", "instructions": "Is it spam?"},
    "urgency": {
        "type": "score",
        "instructions": "How urgent?",
        "criteria": ["can wait", "this week", "today"],
    },
}


async def test_unknown_top_level_fields_are_ignored_and_logged_by_name_only(
    client_factory, quick_engine, caplog
):
    body = {
        "model": "jev-latest",
        "state": "Refund me now.",
        "questions": QUESTIONS,
        "client_tag": "SECRET-VALUE-123",
        "stream": True,
    }
    caplog.set_level(logging.INFO, logger="opendecide.service")
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 200, response.text
    assert "client_tag" not in response.text and "SECRET-VALUE-123" not in response.text
    logged = [r.getMessage() for r in caplog.records if "ignored unknown request fields" in r.getMessage()]
    assert logged == ["ignored unknown request fields in SystemOneRequest: 'client_tag', 'stream'"]
    assert "SECRET-VALUE-123" not in caplog.text


async def test_unknown_fields_are_ignored_on_every_route_body(client_factory, quick_engine):
    body = {"states": ["a", "b"], "questions": {"spam": QUESTIONS["spam"]}, "trace": {"x": 1}}
    async with client_factory(quick_engine) as client:
        batch = await client.post("/decide/batch", json=body)
    assert batch.status_code == 200 and len(batch.json()["results"]) == 2


async def test_unknown_field_inside_a_question_stays_a_422(client_factory, quick_engine):
    body = {"state": "s", "questions": {"tone": {**QUESTIONS["tone"], "weights": [1, 2, 3]}}}
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert item["loc"] == ["body", "questions", "tone", "choice", "weights"] and "Extra inputs" in item["msg"]


async def test_extensions_are_x_prefixed_and_nothing_else_is_added(client_factory, quick_engine):
    async with client_factory(quick_engine) as client:
        body = (
            await client.post("/v1/systemone", json={"state": "Refund me now.", "questions": QUESTIONS})
        ).json()
    assert set(body) == {"model", "answers", "usage", "x_provenance"}
    assert set(body["answers"]["tone"]) == {"type", "choice", "confidence", "probabilities", "x_reading"}
    assert set(body["answers"]["spam"]) == {"type", "noul", "x_reading"}
    assert set(body["answers"]["urgency"]) == {
        "type",
        "score",
        "confidence",
        "legend",
        "probabilities",
        "x_reading",
    }
    assert body["x_provenance"]["engine"] == "function"


async def test_confidence_is_jevs_formula_on_a_known_distribution(client_factory, quick_engine):
    # The function engine reads every state alike, so the default prior correction would divide its
    # whole distribution out: the formula is checked on the read as it is.
    async with client_factory(quick_engine, prior_correction="off") as client:
        answers = (
            await client.post("/v1/systemone", json={"state": "Refund me now.", "questions": QUESTIONS})
        ).json()["answers"]
    tone = answers["tone"]
    p = [tone["probabilities"][name] for name in ("angry", "calm", "excited")]
    assert tone["choice"] == "angry" and p[0] > p[1] > p[2]
    assert tone["confidence"] == pytest.approx((p[0] - 1 / 3) / (1 - 1 / 3))
    assert tone["x_reading"]["top_probability"] == pytest.approx(p[0])
    urgency = answers["urgency"]
    q = [urgency["probabilities"][str(i)] for i in range(3)]  # mode 0
    assert urgency["confidence"] == pytest.approx(max(0.0, 1 - (q[1] * 1 + q[2] * 2) / (2 / 3)))


def test_jev_threshold_keeps_its_automation_rate():
    """A 0.9 threshold tuned on Jev means p_max ≥ 0.95 on two options, not p_max ≥ 0.9."""
    from service.pipeline.confidence import choice_confidence

    assert choice_confidence([0.92, 0.08]) < 0.9 < choice_confidence([0.951, 0.049])
