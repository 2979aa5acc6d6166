"""The prior correction's edges (service/pipeline/prior.py): floor-bounded top-k reads, content-free reads
that miss a label, and the policy's reach. Function engines (named as such) return chosen labels;
the rest reads the embedded model."""

from __future__ import annotations

import pytest

from calibration.open import open_store
from calibration.store import CalibrationKey
from readers.engines.base import EngineReply, ReadMode, ReadRequest
from readers.prompt import CURRENT_LAYOUT
from readers.reader import Reader
from service.pipeline.prior import OptionPriors, PriorCorrection, measure_prior, read_version
from service.protocol import SystemOneRequest
from tests.service.support import function_engine

pytestmark = pytest.mark.anyio

TONE = {
    "type": "choice",
    "instructions": "What is the tone?",
    "criteria": {"angry": None, "calm": None, "excited": None},
}


def returning(local_engine, drop_when: str):
    """A top-k function engine: every label returned (log-probs −0.5, −1.5, …), except the last
    label on prompts whose text contains ``drop_when``, which then falls below the returned tokens."""

    def read(request: ReadRequest) -> EngineReply:
        ids = request.label_ids
        if drop_when in local_engine.tokenizer.decode(request.prompt_ids):
            ids = ids[:-1]
        return EngineReply(
            {token: -0.5 - i for i, token in enumerate(ids)}, ReadMode.TOPK, len(request.prompt_ids), 1.0
        )

    return function_engine(local_engine, read)


async def test_a_read_that_used_the_floor_is_answered_raw_under_the_raw_key(
    client_factory, local_engine, tmp_path
):
    """A floored label's probability is that read's floor; divided by a prior from other reads it could
    win without ever being returned, so such a read is not corrected and is keyed as raw."""
    store = open_store(tmp_path / "c.sqlite3")
    async with client_factory(returning(local_engine, "Refund"), store=store) as client:
        floored = (
            await client.post("/v1/systemone", json={"state": "Refund me now.", "questions": {"t": TONE}})
        ).json()["answers"]["t"]
        whole = (
            await client.post("/v1/systemone", json={"state": "Thanks, all good.", "questions": {"t": TONE}})
        ).json()["answers"]["t"]
    assert floored["x_reading"]["floor_used"] and floored["x_reading"]["prior_correction"] is None
    assert floored["probabilities"] == floored["x_reading"]["raw_probabilities"]
    assert whole["x_reading"]["prior_correction"] is not None  # every label returned: corrected
    info = local_engine.info
    keys = {
        corrected: CalibrationKey(
            info.name,
            info.revision,
            "choice",
            3,
            read_version=read_version(CURRENT_LAYOUT.read_version_for("choice", 3), corrected),
        )
        for corrected in (False, True)
    }
    assert [len(store.recorded(keys[False])), len(store.recorded(keys[True]))] == [1, 1]


async def test_the_prior_is_measured_only_on_content_free_reads_that_returned_every_label(local_engine):
    spec = SystemOneRequest.model_validate({"state": "", "questions": {"t": TONE}}).questions["t"].to_spec()
    partly = await measure_prior(Reader(returning(local_engine, "N/A")), spec)
    assert partly is not None and partly.states == ("", "[MASK]")
    assert (
        await measure_prior(Reader(returning(local_engine, "<|im_start|>")), spec) is None
    )  # every prompt loses a label


async def test_a_prior_cache_is_bounded_and_needs_a_policy():
    with pytest.raises(ValueError, match="off"):
        OptionPriors(PriorCorrection.OFF)
    with pytest.raises(ValueError, match="at least 1"):
        OptionPriors(PriorCorrection.CHOICE, limit=0)
    assert (
        PriorCorrection.CHOICE.covers("choice")
        and not PriorCorrection.CHOICE.covers("noul")
        and PriorCorrection.ALL.covers("score")
    )


def test_a_policy_covers_exactly_the_types_it_names():
    for policy in PriorCorrection:
        covered = {t for t in ("noul", "choice", "score") if policy.covers(t)}
        assert PriorCorrection.of_types(covered) is policy
    assert PriorCorrection.CHOICE_SCORE.covers("score") and not PriorCorrection.CHOICE_SCORE.covers("noul")
    assert (
        not PriorCorrection.OFF.covers("choice")
        and PriorCorrection("choice+score") is PriorCorrection.CHOICE_SCORE
    )
