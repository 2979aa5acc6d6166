"""Calibration modes on the served route (embedded model, real SQLite): temperature + bias, the
label-free prior correction, the state prior (fitted on unlabelled states or served decisions), and
fits that stop applying under another prompt version."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.bias import CONTENT_FREE_STATES, state_prior_bias
from calibration.store import LEGACY_PROMPT_VERSION, CalibrationKey, CalibrationStore
from eval.tasks import TASKS, load_sample, spread
from readers.prompt import PROMPT_VERSION
from readers.reader import Reader
from service.protocol.questions import ChoiceQuestion

pytestmark = pytest.mark.anyio

QUESTION = TASKS["ag_news"].question()
OPTIONS = list(TASKS["ag_news"].options)
STATE = "The central bank raised interest rates again on Tuesday."


def examples(n: int) -> list[dict]:
    return [{"state": r.text, "questions": {"topic": QUESTION}, "gold": {"topic": r.gold}} for r in spread(load_sample("ag_news"), n)]


async def ask(client, question=QUESTION) -> dict:
    response = await client.post("/v1/systemone", json={"state": STATE, "questions": {"t": question}})
    assert response.status_code == 200, response.text
    return response.json()["answers"]["t"]


@pytest.mark.slow  # 24 labelled examples read
async def test_a_temperature_bias_fit_is_stored_applied_and_reported(client_factory, local_engine, tmp_path):
    async with client_factory(local_engine, store=CalibrationStore(tmp_path / "c.sqlite3")) as client:
        fitted = await client.post("/v1/calibrations", json={"examples": examples(24), "mode": "temperature_bias"})
        assert fitted.status_code == 200, fitted.text
        (calibration,) = fitted.json()["calibrations"]
        answer = await ask(client)
        no_count = await client.post("/v1/calibrations/refit", json={"question_type": "choice", "mode": "temperature_bias"})
    assert calibration["mode"] == "temperature_bias" and len(calibration["bias"]) == 4 and sum(calibration["bias"]) == pytest.approx(0, abs=1e-9)
    used = answer["x_reading"]["calibration"]
    assert used["mode"] == "temperature_bias" and used["bias"] == dict(zip(OPTIONS, calibration["bias"]))
    raw = np.array([answer["x_reading"]["raw_probabilities"][o] for o in OPTIONS])
    u = np.log(raw) / calibration["temperature"] + np.array(calibration["bias"])
    expected = np.exp(u - u.max()) / np.exp(u - u.max()).sum()
    assert [answer["probabilities"][o] for o in OPTIONS] == pytest.approx(expected)
    assert no_count.status_code == 422 and "option_count" in no_count.text


@pytest.mark.slow  # 24 states read, unlabelled
async def test_a_state_prior_is_fitted_from_unlabelled_states_or_from_served_decisions(client_factory, local_engine, tmp_path):
    records = spread(load_sample("ag_news"), 24)
    spec = ChoiceQuestion.model_validate(QUESTION).to_spec()
    reader = Reader(local_engine)
    direct = np.array([(await reader.read(spec, r.text)).label_probabilities.probabilities for r in records[:12]])
    store = CalibrationStore(tmp_path / "c.sqlite3")
    unlabelled = [{"state": r.text, "questions": {"topic": QUESTION}} for r in records[:12]]
    async with client_factory(local_engine, store=store) as client:
        needs_gold = await client.post("/v1/calibrations", json={"examples": unlabelled, "mode": "temperature"})
        fitted = await client.post("/v1/calibrations", json={"examples": unlabelled, "mode": "state_prior"})
        assert fitted.status_code == 200, fitted.text
        answer = await ask(client)
        await ask(client, TASKS["ag_news"].question(reversed_options=True))  # recorded, but its positions hold other options
        served = await client.post("/decide/batch", json={"states": [r.text for r in records[12:]], "questions": {"topic": QUESTION}})
        assert served.status_code == 200, served.text
        refit = await client.post("/v1/calibrations/refit", json={"question_type": "choice", "option_count": 4, "mode": "state_prior"})
        assert refit.status_code == 200, refit.text
    assert needs_gold.status_code == 422 and needs_gold.json()["detail"][0]["loc"] == ["body", "examples", 0, "gold"]
    (calibration,) = fitted.json()["calibrations"]
    assert (calibration["mode"], calibration["temperature"], calibration["n"], calibration["source"]) == ("state_prior", 1.0, 12, "states")
    assert calibration["heldout_n"] is None  # no gold answers, no held-out score
    assert calibration["bias"] == pytest.approx(state_prior_bias(direct).tolist(), abs=1e-4)  # −log of the states' mean read, centred
    used = answer["x_reading"]["calibration"]
    assert used["mode"] == "state_prior" and used["id"] == calibration["id"]
    raw = np.array([answer["x_reading"]["raw_probabilities"][o] for o in OPTIONS])
    prior = direct.mean(axis=0) / direct.mean(axis=0).sum()
    assert [answer["probabilities"][o] for o in OPTIONS] == pytest.approx((raw / prior) / (raw / prior).sum(), abs=1e-4)
    recorded = store.recorded(CalibrationKey(local_engine.info.name, local_engine.info.revision, "choice", 4, prompt_version=PROMPT_VERSION))
    assert len(recorded) == 14  # every decision served, none labelled
    same_order = [raw for options, raw in recorded if options == OPTIONS]
    assert (refit.json()["source"], refit.json()["n"]) == ("decisions", 13)  # the reversed question left out
    assert refit.json()["bias"] == pytest.approx(state_prior_bias(same_order).tolist())


async def test_the_prior_correction_divides_out_what_the_model_answers_on_content_free_states(client_factory, local_engine, tmp_path):
    spec = ChoiceQuestion.model_validate(QUESTION).to_spec()
    reader = Reader(local_engine)
    content_free = np.array([(await reader.read(spec, state)).label_probabilities.probabilities for state in CONTENT_FREE_STATES])
    prior = content_free.mean(axis=0) / content_free.mean(axis=0).sum()
    store = CalibrationStore(tmp_path / "c.sqlite3")
    async with client_factory(local_engine, store=store, prior_correction=True) as client:
        answer = await ask(client)
        key = CalibrationKey(local_engine.info.name, local_engine.info.revision, "choice", 4, prompt_version=PROMPT_VERSION)
        fitted = store.add_calibration(key, temperature=2.0, n=50, source="labels")
        with_fit = await ask(client)
    used = answer["x_reading"]["calibration"]
    assert used["mode"] == "prior" and used["id"] is None and used["prompt_version"] == PROMPT_VERSION
    assert used["content_free_states"] == list(CONTENT_FREE_STATES)
    assert [used["prior"][o] for o in OPTIONS] == pytest.approx(prior, rel=1e-4)
    raw = np.array([answer["x_reading"]["raw_probabilities"][o] for o in OPTIONS])
    assert [answer["probabilities"][o] for o in OPTIONS] == pytest.approx((raw / prior) / (raw / prior).sum(), rel=1e-4)
    assert with_fit["x_reading"]["calibration"]["id"] == fitted.id  # a label fit, once there, is applied instead


async def test_a_fit_made_under_another_prompt_version_is_kept_but_not_applied(client_factory, local_engine, tmp_path):
    store = CalibrationStore(tmp_path / "c.sqlite3")
    old = CalibrationKey(local_engine.info.name, local_engine.info.revision, "choice", 4, prompt_version=LEGACY_PROMPT_VERSION)
    kept = store.add_calibration(old, temperature=3.0, n=50, source="labels")
    async with client_factory(local_engine, store=store) as client:
        answer = await ask(client)
        listed = (await client.get("/v1/calibrations")).json()["calibrations"]
    assert answer["x_reading"]["calibration"] is None
    assert answer["probabilities"] == answer["x_reading"]["raw_probabilities"]
    assert [(c["id"], c["prompt_version"]) for c in listed] == [(kept.id, LEGACY_PROMPT_VERSION)]
