"""The probe calibration on the served route (embedded model, real SQLite): fitted from examples on
the answer slot's hidden state, applied to answers as stored, refitted from feedback on the recorded
states, and refused by name on an engine that returns no state."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fit import MIN_GOLD
from calibration.open import open_store
from calibration.probe import PROBE_MEMBERS, ProbeMap, ProbeMember
from calibration.store import CalibrationKey
from calibration.temperature import as_logits
from eval.decisions.tasks import TASKS, load_sample, spread
from readers.reader import Reader
from service.protocol.questions import NoulQuestion
from tests.service.support import favour_first, function_engine

pytestmark = pytest.mark.anyio

QUESTION = TASKS["irony"].question()
STATE = "Just what I needed today, another flat tyre. #blessed"


def examples(n: int) -> list[dict]:
    return [
        {"state": r.text, "questions": {"ironic": QUESTION}, "gold": {"ironic": r.gold == "true"}}
        for r in spread(load_sample("irony", "dev"), n)
    ]


@pytest.mark.slow  # 24 examples read, then 12 decisions with feedback
async def test_a_probe_is_fitted_applied_to_the_answer_slot_state_and_refitted_from_feedback(
    client_factory, local_engine, tmp_path
):
    store = open_store(tmp_path / "c.sqlite3")
    async with client_factory(local_engine, store=store, auto_refit_every=12) as client:
        fitted = await client.post("/v1/calibrations", json={"examples": examples(24), "mode": "probe"})
        assert fitted.status_code == 200, fitted.text
        (calibration,) = fitted.json()["calibrations"]
        response = await client.post("/v1/systemone", json={"state": STATE, "questions": {"q": QUESTION}})
        assert response.status_code == 200, response.text
        answer = response.json()["answers"]["q"]
        stored = store.lookup(store.calibrations()[0].key)  # the fit the answer used, before any refit
        # Feedback on decisions made now: each recorded with its state, a probe refit fits on them.
        refit = None
        for record in spread(load_sample("irony"), 12):
            decided = await client.post(
                "/v1/systemone", json={"state": record.text, "questions": {"q": QUESTION}}
            )
            decision_id = decided.json()["answers"]["q"]["x_reading"]["decision_id"]
            told = await client.post(
                "/v1/feedback", json={"decision_id": decision_id, "gold": record.gold == "true"}
            )
            assert told.status_code == 200, told.text
            refit = told.json()["refit"] or refit
        metrics = (await client.get("/metrics")).text
    assert (
        calibration["mode"] == "probe"
        and calibration["probe_dimension"] == local_engine.model.config.hidden_size
        and calibration["probe_members"] == PROBE_MEMBERS
    )
    assert "probe" not in calibration  # the weights are not listed
    used = answer["x_reading"]["calibration"]
    assert used["mode"] == "probe" and used["id"] == calibration["id"] and used["n"] == 24
    # The answer is the stored map applied to this read's own hidden state.
    reading = await Reader(local_engine).read(NoulQuestion.model_validate(QUESTION).to_spec(), STATE)
    raw = [answer["x_reading"]["raw_probabilities"][o] for o in ("true", "false")]
    expected = store.load_probe(stored).apply(as_logits(raw), reading.features)
    assert answer["noul"] == pytest.approx(float(expected[0]), abs=1e-5)
    # The caller named the mode: the refit from feedback keeps it, fitted on the recorded states.
    assert (
        refit is not None and refit["mode"] == "probe" and refit["source"] == "feedback" and refit["n"] == 12
    )
    # The fit and the refit were each decoded once, as they were stored; thirteen answers read them
    # from the probe cache, loading nothing.
    for line in (
        "decide_probe_cache_probes 2.0",
        "decide_probe_cache_loads_total 2.0",
        "decide_probe_cache_evictions_total 0.0",
    ):
        assert line in metrics.splitlines(), line


async def test_a_probe_is_refused_by_name_on_an_engine_without_hidden_states(
    client_factory, local_engine, tmp_path
):
    engine = function_engine(local_engine, favour_first)
    assert not engine.capabilities.features
    async with client_factory(engine, store=open_store(tmp_path / "c.sqlite3")) as client:
        fitted = await client.post("/v1/calibrations", json={"examples": examples(10), "mode": "probe"})
        refit = await client.post(
            "/v1/calibrations/refit", json={"question_type": "noul", "option_count": 2, "mode": "probe"}
        )
    for response in (fitted, refit):
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", "mode"] and "hidden state" in error["msg"]


async def test_feedback_on_a_named_probe_key_without_hidden_states_is_kept_and_says_why_no_refit(
    client_factory, local_engine, tmp_path
):
    """A caller named the probe for a key (stored here directly), and the key's decisions come from a
    replica without hidden states (a function engine, as a vLLM one): the feedback is recorded and
    acknowledged, and the automatic refit that cannot be made is reported, not a 500."""
    store = open_store(tmp_path / "c.sqlite3")
    engine = function_engine(local_engine, favour_first)
    records = spread(load_sample("irony"), MIN_GOLD)
    async with client_factory(engine, store=store, auto_refit_every=MIN_GOLD) as client:
        ids = []
        for record in records:
            decided = await client.post(
                "/v1/systemone", json={"state": record.text, "questions": {"q": QUESTION}}
            )
            ids.append(decided.json()["answers"]["q"]["x_reading"]["decision_id"])
        made = store.decision(ids[0])
        key = CalibrationKey(
            made.model, made.revision, "noul", 2, None, read_version=made.read_version, tenant=made.tenant
        )
        member = ProbeMember(1.0, np.zeros(2), np.zeros(4), np.ones(4), np.zeros((2, 4)))
        store.add_calibration(
            key,
            temperature=1.0,
            n=24,
            source="examples",
            mode="probe",
            bias=[0, 0],
            probe=ProbeMap.of([member]),
        )
        replies = []
        for decision_id, record in zip(ids, records):
            told = await client.post(
                "/v1/feedback", json={"decision_id": decision_id, "gold": record.gold == "true"}
            )
            replies.append(told)
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in replies] == [200] * MIN_GOLD, replies[-1].text
    last = replies[-1].json()
    assert last["gold_answers"] == MIN_GOLD and last["refit"] is None
    assert "hidden state" in last["refit_skipped"] and store.lookup(key).n == 24
    assert 'decide_automatic_refits_total{outcome="failed"} 1.0' in metrics
