"""Calibration modes on the served route (embedded model, real SQLite): temperature + bias, the
content-free prior correction, the state prior (fitted on states without gold answers or served decisions), and
fits that stop applying under another prompt version."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.bias import CONTENT_FREE_STATES, state_prior_bias
from calibration.open import open_store
from calibration.store import LEGACY_READ_VERSION, CalibrationKey
from eval.decisions.tasks import TASKS, load_sample, spread
from readers.prompt import CURRENT_LAYOUT, PROMPT_VERSION, LabelStyle
from readers.reader import Reader
from service.pipeline.decide import decide
from service.pipeline.prior import OptionPriors, PriorCorrection, read_version
from service.protocol import SystemOneRequest
from service.protocol.questions import ChoiceQuestion, NoulQuestion

pytestmark = pytest.mark.anyio

QUESTION = TASKS["ag_news"].question()
OPTIONS = list(TASKS["ag_news"].options)
STATE = "The central bank raised interest rates again on Tuesday."


def examples(n: int) -> list[dict]:
    return [
        {"state": r.text, "questions": {"topic": QUESTION}, "gold": {"topic": r.gold}}
        for r in spread(load_sample("ag_news"), n)
    ]


async def ask(client, question=QUESTION) -> dict:
    response = await client.post("/v1/systemone", json={"state": STATE, "questions": {"t": question}})
    assert response.status_code == 200, response.text
    return response.json()["answers"]["t"]


@pytest.mark.slow  # 24 examples with gold answers read
async def test_a_temperature_bias_fit_is_stored_applied_and_reported(client_factory, local_engine, tmp_path):
    """Under the default policy a choice fit is made on prior-corrected reads and applied after the correction."""
    async with client_factory(local_engine, store=open_store(tmp_path / "c.sqlite3")) as client:
        fitted = await client.post(
            "/v1/calibrations", json={"examples": examples(24), "mode": "temperature_bias"}
        )
        assert fitted.status_code == 200, fitted.text
        (calibration,) = fitted.json()["calibrations"]
        answer = await ask(client)
        no_count = await client.post(
            "/v1/calibrations/refit", json={"question_type": "choice", "mode": "temperature_bias"}
        )
    assert (
        calibration["mode"] == "temperature_bias"
        and len(calibration["bias"]) == 4
        and sum(calibration["bias"]) == pytest.approx(0, abs=1e-9)
    )
    assert calibration["read_version"] == read_version(CURRENT_LAYOUT.read_version_for("choice", 4), True)
    used = answer["x_reading"]["calibration"]
    assert used["mode"] == "temperature_bias" and used["bias"] == dict(zip(OPTIONS, calibration["bias"]))
    raw = np.array([answer["x_reading"]["raw_probabilities"][o] for o in OPTIONS])
    prior = np.array([answer["x_reading"]["prior_correction"]["prior"][o] for o in OPTIONS])
    u = np.log((raw / prior) / (raw / prior).sum()) / calibration["temperature"] + np.array(
        calibration["bias"]
    )
    expected = np.exp(u - u.max()) / np.exp(u - u.max()).sum()
    assert [answer["probabilities"][o] for o in OPTIONS] == pytest.approx(expected)
    assert no_count.status_code == 422 and "option_count" in no_count.text


@pytest.mark.slow  # 24 states read, no gold answers
async def test_a_state_prior_is_fitted_from_states_without_gold_or_from_served_decisions(
    client_factory, local_engine, tmp_path
):
    records = spread(load_sample("ag_news"), 24)
    spec = ChoiceQuestion.model_validate(QUESTION).to_spec()
    reader = Reader(local_engine)
    direct = np.array(
        [(await reader.read(spec, r.text)).label_probabilities.probabilities for r in records[:12]]
    )
    store = open_store(tmp_path / "c.sqlite3")
    without_gold = [{"state": r.text, "questions": {"topic": QUESTION}} for r in records[:12]]
    async with client_factory(
        local_engine, store=store, prior_correction="off"
    ) as client:  # fits on the model's own reads
        needs_gold = await client.post(
            "/v1/calibrations", json={"examples": without_gold, "mode": "temperature"}
        )
        fitted = await client.post("/v1/calibrations", json={"examples": without_gold, "mode": "state_prior"})
        assert fitted.status_code == 200, fitted.text
        answer = await ask(client)
        await ask(
            client, TASKS["ag_news"].question(reversed_options=True)
        )  # recorded, but its positions hold other options
        served = await client.post(
            "/decide/batch", json={"states": [r.text for r in records[12:]], "questions": {"topic": QUESTION}}
        )
        assert served.status_code == 200, served.text
        refit = await client.post(
            "/v1/calibrations/refit",
            json={"question_type": "choice", "option_count": 4, "mode": "state_prior"},
        )
        assert refit.status_code == 200, refit.text
    assert needs_gold.status_code == 422 and needs_gold.json()["detail"][0]["loc"] == [
        "body",
        "examples",
        0,
        "gold",
    ]
    (calibration,) = fitted.json()["calibrations"]
    assert (calibration["mode"], calibration["temperature"], calibration["n"], calibration["source"]) == (
        "state_prior",
        1.0,
        12,
        "states",
    )
    assert calibration["heldout_n"] is None  # no gold answers, no held-out score
    assert calibration["bias"] == pytest.approx(
        state_prior_bias(direct).tolist(), abs=1e-4
    )  # −log of the states' mean read, centred
    used = answer["x_reading"]["calibration"]
    assert used["mode"] == "state_prior" and used["id"] == calibration["id"]
    raw = np.array([answer["x_reading"]["raw_probabilities"][o] for o in OPTIONS])
    prior = direct.mean(axis=0) / direct.mean(axis=0).sum()
    assert [answer["probabilities"][o] for o in OPTIONS] == pytest.approx(
        (raw / prior) / (raw / prior).sum(), abs=1e-4
    )
    recorded = store.recorded(
        CalibrationKey(
            local_engine.info.name,
            local_engine.info.revision,
            "choice",
            4,
            read_version=CURRENT_LAYOUT.read_version_for("choice", 4),
        )
    )
    assert len(recorded) == 14  # every decision served, none with a gold answer
    same_order = [raw for options, raw in recorded if options == OPTIONS]
    assert (refit.json()["source"], refit.json()["n"]) == ("decisions", 13)  # the reversed question left out
    assert refit.json()["bias"] == pytest.approx(state_prior_bias(same_order).tolist())


async def test_the_prior_correction_divides_out_what_the_model_answers_on_content_free_states(
    client_factory, local_engine, tmp_path
):
    prior = await content_free_prior(local_engine, ChoiceQuestion.model_validate(QUESTION).to_spec())
    store = open_store(tmp_path / "c.sqlite3")
    async with client_factory(local_engine, store=store) as client:  # the default: choice questions
        answer = await ask(client)
        yes_no = await ask(client, NOUL)
        raw_fit = store.add_calibration(
            choice_key(local_engine, corrected=False), temperature=3.0, n=50, source="examples"
        )
        still = await ask(client)
        fitted = store.add_calibration(
            choice_key(local_engine, corrected=True), temperature=2.0, n=50, source="examples"
        )
        with_fit = await ask(client)
    used = answer["x_reading"]["prior_correction"]
    assert answer["x_reading"]["calibration"] is None and used["prompt_version"] == PROMPT_VERSION
    assert used["content_free_states"] == list(CONTENT_FREE_STATES)
    assert [used["prior"][o] for o in OPTIONS] == pytest.approx(prior, rel=1e-4)
    raw = np.array([answer["x_reading"]["raw_probabilities"][o] for o in OPTIONS])
    corrected = (raw / prior) / (raw / prior).sum()
    assert [answer["probabilities"][o] for o in OPTIONS] == pytest.approx(corrected, rel=1e-4)
    assert answer["choice"] == OPTIONS[int(np.argmax(corrected))]
    recorded = [read for _, read in store.recorded(choice_key(local_engine, corrected=True))]
    assert len(recorded) == 3 and all(
        read == pytest.approx(corrected, rel=1e-4) for read in recorded
    )  # the read their fits are made on
    assert store.recorded(choice_key(local_engine, corrected=False)) == []
    assert (
        yes_no["x_reading"]["prior_correction"] is None
        and yes_no["noul"] == yes_no["x_reading"]["raw_probabilities"]["true"]
    )
    # A fit on raw reads does not apply to corrected ones; a fit on corrected reads applies after the correction.
    assert still["x_reading"]["calibration"] is None and raw_fit.id != fitted.id
    assert (
        with_fit["x_reading"]["calibration"]["id"] == fitted.id
        and with_fit["x_reading"]["prior_correction"] is not None
    )
    tempered = np.exp(np.log(corrected) / 2.0) / np.exp(np.log(corrected) / 2.0).sum()
    assert [with_fit["probabilities"][o] for o in OPTIONS] == pytest.approx(tempered, rel=1e-4)


NOUL = {"type": "noul", "instructions": "Is this about money?"}


async def content_free_prior(engine, spec) -> np.ndarray:
    """The prior measured by hand: the mean read on the content-free states, renormalised."""
    reader = Reader(engine)
    reads = np.array(
        [(await reader.read(spec, state)).label_probabilities.probabilities for state in CONTENT_FREE_STATES]
    )
    return reads.mean(axis=0) / reads.mean(axis=0).sum()


def choice_key(engine, *, corrected: bool) -> CalibrationKey:
    return CalibrationKey(
        engine.info.name,
        engine.info.revision,
        "choice",
        4,
        read_version=read_version(CURRENT_LAYOUT.read_version_for("choice", 4), corrected),
    )


@pytest.mark.slow  # content-free states read per question type
async def test_the_prior_correction_policy_names_the_questions_it_covers(client_factory, local_engine):
    prior = await content_free_prior(local_engine, NoulQuestion.model_validate(NOUL).to_spec())
    async with client_factory(local_engine, prior_correction="all") as client:
        every = [await ask(client, NOUL), await ask(client)]
    async with client_factory(local_engine, prior_correction="off") as client:
        off = [await ask(client, NOUL), await ask(client)]
    assert all(a["x_reading"]["prior_correction"] is not None for a in every)
    raw_true = every[0]["x_reading"]["raw_probabilities"]["true"]
    expected = (raw_true / prior[0]) / (raw_true / prior[0] + (1 - raw_true) / prior[1])
    assert every[0]["noul"] == pytest.approx(expected, rel=1e-4)
    assert [a["x_reading"]["prior_correction"] for a in off] == [None, None]
    assert off[0]["noul"] == off[0]["x_reading"]["raw_probabilities"]["true"]
    assert off[1]["probabilities"] == off[1]["x_reading"]["raw_probabilities"]


@pytest.mark.slow  # every rotation read
async def test_a_read_averaged_over_rotations_is_not_prior_corrected(local_engine):
    """Letter codes are listed in order, so rotations are real reads; their average has the position
    bias out already, and a prior read in the asked order would put it back."""
    reader = Reader(local_engine, label_styles=[LabelStyle.CODES])
    priors = OptionPriors(PriorCorrection.CHOICE)

    async def answer(question: dict) -> dict:
        response = await decide(
            SystemOneRequest.model_validate({"state": STATE, "questions": {"t": question}}),
            reader,
            request_id="r",
            priors=priors,
        )
        return response.answers["t"].reading.model_dump(mode="json")

    asked, rotated = await answer(QUESTION), await answer({**QUESTION, "x_debias": "rotate"})
    assert asked["label_style"] == "codes" and asked["prior_correction"] is not None
    assert (rotated["rotations"], rotated["prior_correction"]) == (4, None)


@pytest.mark.slow  # content-free states read per question set
async def test_the_prior_cache_keeps_the_latest_questions_only(local_engine):
    reader = Reader(local_engine)
    priors = OptionPriors(PriorCorrection.ALL, limit=2)
    questions = [
        NoulQuestion.model_validate({"type": "noul", "instructions": f"Is this about topic {i}?"}).to_spec()
        for i in range(3)
    ]
    first = await priors.prior(reader, questions[0])
    await priors.prior(reader, questions[1])
    await priors.prior(reader, questions[0])  # used again: now the most recent
    await priors.prior(reader, questions[2])
    held = [priors.held(reader, question) for question in questions]
    assert len(priors) == 2 and held == [True, False, True]
    await priors.prior(reader, questions[1])  # measured again, dropping the least recently used
    assert not priors.held(reader, questions[0]) and (
        await priors.prior(reader, questions[0])
    ).prior == pytest.approx(first.prior, abs=1e-6)


@pytest.mark.slow  # content-free states read for six questions
async def test_a_tenant_sending_new_questions_evicts_its_own_priors_not_anothers(local_engine):
    """Priors are kept per cache salt, and past the limit the salt holding the most gives back: b's
    stream of new questions never evicts a's two, which a's next answers would wait on again."""
    priors = OptionPriors(PriorCorrection.ALL, limit=4)
    a, b = (Reader(local_engine).for_tenant(tenant, f"salt-{tenant}") for tenant in ("a", "b"))
    questions = [
        NoulQuestion.model_validate({"type": "noul", "instructions": f"Is this about topic {i}?"}).to_spec()
        for i in range(6)
    ]
    for question in questions[:2]:
        await priors.prior(a, question)
    for question in questions[2:]:
        await priors.prior(b, question)
    before = local_engine.batched_reads
    for question in questions[:2]:  # a's priors are still held: no content-free state read again
        await priors.prior(a, question)
    assert local_engine.batched_reads == before and len(priors) == 4
    await priors.prior(b, questions[2])  # b's oldest was its own to give back: measured again
    assert local_engine.batched_reads > before


async def test_a_fit_made_under_another_prompt_version_is_kept_but_not_applied(
    client_factory, local_engine, tmp_path
):
    store = open_store(tmp_path / "c.sqlite3")
    old = CalibrationKey(
        local_engine.info.name, local_engine.info.revision, "choice", 4, read_version=LEGACY_READ_VERSION
    )
    kept = store.add_calibration(old, temperature=3.0, n=50, source="examples")
    async with client_factory(local_engine, store=store) as client:
        answer = await ask(client)
        listed = (await client.get("/v1/calibrations")).json()["calibrations"]
    assert answer["x_reading"]["calibration"] is None
    assert [(c["id"], c["read_version"]) for c in listed] == [(kept.id, LEGACY_READ_VERSION)]
