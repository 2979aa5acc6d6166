"""Calibration routes (opendecide extension): fit from examples, feedback, refits, listing.

A refit reads the store (``calibration.fit.refit_from_store``): the decisions with feedback, or for
``state_prior`` the recorded decisions of the key, with or without feedback.

Mounted only when the app has a calibration store.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from calibration.fit import MIN_GOLD, gold_index, refit_from_store
from calibration.store import Calibration, CalibrationKey
from readers.prompt import PROMPT_VERSION, content_text
from service.admission import admitted
from service.cancel import unless_disconnected
from service.errors import UnknownDecision, validation_error
from service.openapi import body_schema, error_responses
from service.parse import parse_body, parse_for_model
from service.pipeline.examples import fit_from_examples
from service.pipeline.prior import read_version
from service.protocol import (
    CalibrationList,
    CalibrationOut,
    CalibrationRequest,
    FeedbackRequest,
    FeedbackResponse,
    RefitRequest,
)
from service.state import reader_of, store_of

router = APIRouter()

WRITE_ERRORS = error_responses(400, 401, 408, 413, 415, 422, 429, 502, 503, 504)


def calibration_out(calibration: Calibration) -> CalibrationOut:
    return CalibrationOut(**calibration.as_json())


@router.post(
    "/v1/calibrations",
    response_model=CalibrationList,
    openapi_extra=body_schema(CalibrationRequest),
    responses=error_responses(400, 401, 408, 413, 415, 422, 429, 502, 503, 504, 529),
)
async def create_calibrations(request: Request) -> CalibrationList:
    reader, body = await parse_for_model(request, CalibrationRequest)

    def work():
        return fit_from_examples(body, reader, store_of(request), priors=request.app.state.priors)

    # Admitted by the cost of its reads, as /decide/batch is: an example set is as much work.
    jobs = [
        ([content_text(example.state)], example.questions, ("body", "examples", i))
        for i, example in enumerate(body.examples)
    ]
    fitted = await unless_disconnected(request, admitted(request, reader, jobs, work))
    return CalibrationList(calibrations=[calibration_out(c) for c in fitted])


@router.get("/v1/calibrations", response_model=CalibrationList, responses=error_responses(401))
async def list_calibrations(request: Request) -> CalibrationList:
    return CalibrationList(calibrations=[calibration_out(c) for c in store_of(request).calibrations()])


@router.post(
    "/v1/feedback",
    response_model=FeedbackResponse,
    openapi_extra=body_schema(FeedbackRequest),
    responses=error_responses(400, 401, 404, 408, 413, 415, 422, 429),
)
async def feedback(request: Request) -> FeedbackResponse:
    store = store_of(request)
    body = parse_body(await request.body(), FeedbackRequest)
    decision = await asyncio.to_thread(store.decision, body.decision_id)
    if decision is None:
        raise UnknownDecision(f"no decision {body.decision_id!r} is recorded here")
    try:
        gold = gold_index(decision.question_type, decision.options, body.gold)
    except ValueError as error:
        raise validation_error(("body", "gold"), str(error), "invalid_gold") from None
    recorded = await asyncio.to_thread(store.add_feedback, decision.id, decision.options[gold])
    key = CalibrationKey(
        decision.model,
        decision.revision,
        decision.question_type,
        decision.option_count,
        decision.domain,
        read_version=decision.read_version,
    )
    gold_rows = await asyncio.to_thread(store.gold_rows, key)
    refit = None
    every = request.app.state.auto_refit_every
    if every and len(gold_rows) >= MIN_GOLD and len(gold_rows) % every == 0:
        current = store.lookup(key)  # a refit keeps the mode the key was fitted in
        mode = current.mode if current is not None and current.key == key else "temperature"
        refit = calibration_out(await asyncio.to_thread(refit_from_store, store, key, mode, gold_rows))
    return FeedbackResponse(
        decision_id=decision.id, recorded=recorded, gold_answers=len(gold_rows), refit=refit
    )


@router.post(
    "/v1/calibrations/refit",
    response_model=CalibrationOut,
    openapi_extra=body_schema(RefitRequest),
    responses=WRITE_ERRORS,
)
async def refit(request: Request) -> CalibrationOut:
    reader = reader_of(request)
    store = store_of(request)
    body = parse_body(await request.body(), RefitRequest)
    info = reader.engine.info
    priors = request.app.state.priors
    # The key this service's answers to such questions are read under: prior-corrected where its policy
    # covers the type. Decisions answered raw under a covered type (rotated or floor-bounded reads)
    # are refitted from their feedback (POST /v1/feedback keys on the recorded decision's version).
    corrected = priors is not None and priors.policy.covers(body.question_type)
    key = CalibrationKey(
        info.name,
        info.revision,
        body.question_type,
        body.option_count,
        body.domain,
        read_version=read_version(PROMPT_VERSION, corrected),
    )
    try:
        fitted = await asyncio.to_thread(refit_from_store, store, key, body.mode)
    except ValueError as error:
        raise validation_error(
            ("body",),
            str(error),
            "not_enough_decisions" if body.mode == "state_prior" else "not_enough_feedback",
        ) from None
    return calibration_out(fitted)
