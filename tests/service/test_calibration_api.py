"""Calibration on the served route, on real reads of the embedded model and a real SQLite file."""

from __future__ import annotations

import math

import pytest

from calibration.open import open_store
from eval.decisions.tasks import TASKS, load_sample, spread
from readers.prompt import PROMPT_VERSION
from service.app import create_app
from service.pipeline.prior import read_version
from service.refit_limits import RefitLimits

pytestmark = pytest.mark.anyio

QUESTION = TASKS["sst2"].question()


def examples(n: int) -> list[dict]:
    return [
        {"state": r.text, "questions": {"sentiment": QUESTION}, "gold": {"sentiment": r.gold}}
        for r in spread(load_sample("sst2"), n)
    ]


@pytest.mark.slow  # 60 examples with gold answers read
async def test_fit_apply_report_and_survive_a_restart(client_factory, local_engine, tmp_path):
    path = tmp_path / "calibration.sqlite3"
    async with client_factory(local_engine, store=open_store(path)) as client:
        fitted = await client.post("/v1/calibrations", json={"examples": examples(60), "seed": 1})
        assert fitted.status_code == 200, fitted.text
        (calibration,) = fitted.json()["calibrations"]
        assert (
            calibration["question_type"] == "choice"
            and calibration["option_count"] == 2
            and calibration["n"] == 60
        )
        assert (
            0.05 <= calibration["temperature"] <= 20 and calibration["nll_after"] <= calibration["nll_before"]
        )
        assert calibration["heldout_n"] == 30 and calibration["heldout_ece_before"] is not None
        listed = (await client.get("/v1/calibrations")).json()["calibrations"]
        assert [c["id"] for c in listed] == [calibration["id"]]
        answer = (
            await client.post(
                "/v1/systemone", json={"state": "A joyless, plodding mess.", "questions": {"s": QUESTION}}
            )
        ).json()["answers"]["s"]

    used = answer["x_reading"]["calibration"]
    assert used == {
        "mode": "temperature", "id": calibration["id"], "temperature": calibration["temperature"], "n": 60, "bias": None,
        "read_version": read_version(PROMPT_VERSION, True),
    }  # fmt: skip
    # A choice question: fitted on, and applied after, the default prior correction.
    assert (
        calibration["read_version"] == read_version(PROMPT_VERSION, True)
        and calibration["mode"] == "temperature"
        and calibration["heldout_ece_floor"] > 0
    )
    raw, prior = answer["x_reading"]["raw_probabilities"], answer["x_reading"]["prior_correction"]["prior"]
    corrected = {o: (raw[o] / prior[o]) / sum(raw[k] / prior[k] for k in raw) for o in raw}
    t = calibration["temperature"]
    weights = {o: math.exp(math.log(p) / t) for o, p in corrected.items()}
    expected = {o: w / sum(weights.values()) for o, w in weights.items()}
    assert answer["probabilities"] == pytest.approx(expected)
    assert answer["confidence"] == pytest.approx(
        2 * max(expected.values()) - 1
    )  # Jev's (p_max − 1/2) / (1 − 1/2)
    assert answer["x_reading"]["top_probability"] == pytest.approx(max(expected.values()))

    async with client_factory(local_engine, store=open_store(path)) as client:
        again = (
            await client.post(
                "/v1/systemone", json={"state": "A joyless, plodding mess.", "questions": {"s": QUESTION}}
            )
        ).json()
    assert again["answers"]["s"]["x_reading"]["calibration"]["id"] == calibration["id"]


async def test_uncalibrated_keys_report_null(client_factory, local_engine, tmp_path):
    async with client_factory(local_engine, store=open_store(tmp_path / "c.sqlite3")) as client:
        answer = (
            await client.post(
                "/v1/systemone",
                json={"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}},
            )
        ).json()
    reading = answer["answers"]["q"]["x_reading"]
    assert reading["calibration"] is None and reading["decision_id"].startswith("dec_")


@pytest.mark.slow  # 12 decisions read, then refits: the fast tier keeps the prior correction's real reads
async def test_feedback_is_recorded_and_refits_every_n_gold_answers(client_factory, local_engine, tmp_path):
    records = spread(load_sample("sst2"), 12)
    now = [0.0]
    limits = RefitLimits(clock=lambda: now[0])
    async with client_factory(
        local_engine, store=open_store(tmp_path / "c.sqlite3"), auto_refit_every=10, refit_limits=limits
    ) as client:
        batch = (
            await client.post(
                "/decide/batch", json={"states": [r.text for r in records], "questions": {"s": QUESTION}}
            )
        ).json()
        ids = [result["answers"]["s"]["x_reading"]["decision_id"] for result in batch["results"]]
        replies = []
        for decision_id, record in zip(ids, records):
            reply = await client.post("/v1/feedback", json={"decision_id": decision_id, "gold": record.gold})
            assert reply.status_code == 200, reply.text
            replies.append(reply.json())
        assert [r["gold_answers"] for r in replies] == list(range(1, 13))
        assert [r["refit"] is not None for r in replies] == [i == 9 for i in range(12)]
        assert replies[9]["refit"]["source"] == "feedback" and replies[9]["refit"]["n"] == 10

        unknown = await client.post("/v1/feedback", json={"decision_id": "dec_nope", "gold": "positive"})
        assert unknown.status_code == 404 and unknown.json()["detail"]["error_type"] == "unknown_decision"
        invalid = await client.post("/v1/feedback", json={"decision_id": ids[0], "gold": "neutral"})
        assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["body", "gold"]

        now[0] += limits.key_interval_s  # the key's automatic refit was this key's last
        refit = await client.post(
            "/v1/calibrations/refit", json={"question_type": "choice", "option_count": 2}
        )
        assert refit.status_code == 200 and refit.json()["n"] == 12
        answer = (await client.post("/decide", json={"state": "fine", "questions": {"s": QUESTION}})).json()[
            "answers"
        ]["s"]
        assert answer["x_reading"]["calibration"]["id"] == refit.json()["id"]


async def test_too_few_gold_answers_are_refused(client_factory, local_engine, tmp_path):
    async with client_factory(local_engine, store=open_store(tmp_path / "c.sqlite3")) as client:
        response = await client.post("/v1/calibrations", json={"examples": examples(4)})
        bad_gold = await client.post(
            "/v1/calibrations", json={"examples": [{**examples(1)[0], "gold": {"sentiment": "meh"}}]}
        )
    assert response.status_code == 422 and "at least 10" in response.json()["detail"][0]["msg"]
    assert bad_gold.status_code == 422 and bad_gold.json()["detail"][0]["loc"] == [
        "body",
        "examples",
        0,
        "gold",
        "sentiment",
    ]


def test_refit_policy_is_validated(local_engine, tmp_path):
    with pytest.raises(ValueError):
        create_app(local_engine, store=open_store(tmp_path / "c.sqlite3"), auto_refit_every=0)


REFIT = "/v1/calibrations/refit"


async def test_refits_over_the_limit_get_429_naming_it_with_retry_after(
    client_factory, quick_engine, tmp_path
):
    now = [0.0]
    limits = RefitLimits(key_interval_s=5, per_minute=3, clock=lambda: now[0])
    async with client_factory(
        quick_engine, store=open_store(tmp_path / "c.sqlite3"), refit_limits=limits
    ) as client:
        two = {"question_type": "choice", "option_count": 2}
        assert (
            await client.post(REFIT, json=two)
        ).status_code == 422  # no feedback yet: it counts all the same
        again = await client.post(REFIT, json=two)
        assert again.status_code == 429 and again.headers["retry-after"] == "5"
        assert again.json()["detail"]["error_type"] == "rate_limit_error"
        assert "one refit per key and mode every 5 s" in again.json()["detail"]["message"]
        now[0] = 5.0
        assert (await client.post(REFIT, json=two)).status_code == 422  # the key's interval has passed
        assert (await client.post(REFIT, json={**two, "option_count": 3})).status_code == 422  # another key
        tenant = await client.post(REFIT, json={**two, "option_count": 4})
        # 3 a minute: the bucket refills one refit every 20 s, and holds 0.25 of one at 5 s.
        assert tenant.status_code == 429 and tenant.headers["retry-after"] == "15"
        assert "3 refits a minute per tenant" in tenant.json()["detail"]["message"]


async def test_an_automatic_refit_over_the_limit_is_skipped_counted_and_made_at_the_next_feedback(
    client_factory, quick_engine, tmp_path
):
    now = [0.0]
    limits = RefitLimits(key_interval_s=5, clock=lambda: now[0])
    async with client_factory(
        quick_engine, store=open_store(tmp_path / "c.sqlite3"), auto_refit_every=5, refit_limits=limits
    ) as client:
        states = [f"review {i}" for i in range(17)]
        batch = await client.post("/decide/batch", json={"states": states, "questions": {"s": QUESTION}})
        ids = [result["answers"]["s"]["x_reading"]["decision_id"] for result in batch.json()["results"]]
        refits = {}
        for i, decision_id in enumerate(ids, start=1):
            if i == 17:
                now[0] = 5.0  # the key's interval has passed
            reply = await client.post("/v1/feedback", json={"decision_id": decision_id, "gold": "positive"})
            assert reply.status_code == 200, reply.text
            refits[i] = reply.json()["refit"]
        # Due at 10 and 15; 15 is skipped (5 s per key), so 16 is due again and skipped, and 17 refits.
        assert [i for i, refit in refits.items() if refit is not None] == [10, 17]
        assert refits[17]["n"] == 17 and limits.skipped == 2
