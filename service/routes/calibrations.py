"""Calibration routes (opendecide extension): fit from examples, feedback, refits, listing.

Every route needs the ``calibrate`` scope and works on the caller's tenant only: its fits (plus the
shared ones, in lists), its decisions, its feedback. Feedback needs ``calibrate`` too, not ``decide``:
gold answers are what the tenant's fits are made on (and an automatic refit writes one), so a key that
may only ask must not be able to move the answers. Publishing a fit as ``shared`` needs ``admin``.
A refit reads the store (``calibration.fit.refit_from_store``): the tenant's decisions with feedback,
or for ``state_prior`` its recorded decisions of the key, with or without feedback.

Every stored fit writes an audit line (``service/audit.py``). Refits, explicit and automatic, are
rate-limited per key and per tenant (``service/refit_limits.py``). Store calls that query run in a worker
thread; ``lookup`` and ``calibrations`` read the store's in-memory cache and run on the event loop.

Mounted only when the app has a calibration store.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from calibration.fit import MIN_GOLD, gold_index, refit_from_store, refit_mode
from calibration.store import FEATURE_MODES, Calibration, CalibrationKey
from readers.prompt import CURRENT_LAYOUT, content_text
from service.admission import admitted
from service.audit import audit
from service.cancel import unless_disconnected
from service.errors import UnknownDecision, validation_error
from service.openapi import body_schema, error_responses
from service.parse import parse_for_model, parse_request
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
from service.scopes import Caller, require_scope
from service.state import reader_of, store_of

router = APIRouter()

WRITE_ERRORS = error_responses(400, 401, 403, 408, 413, 415, 422, 429, 502, 503, 504)


def calibration_out(calibration: Calibration) -> CalibrationOut:
    row = calibration.as_json()
    del row["probe"]  # up to megabytes of weights: its shape is what a listing says
    return CalibrationOut(
        **row,
        probe_dimension=calibration.probe_dimension,
        probe_members=calibration.probe_members,
        shared=calibration.shared,
    )


def caller_for(request: Request, what: str, *, shared: bool = False) -> Caller:
    """The caller, refused with 403 unless it may ``what`` (calibrate; admin too to publish a shared fit)."""
    caller = require_scope(request.scope["state"], "calibrate", what)
    if shared:
        require_scope(request.scope["state"], "admin", f"{what} with shared: true")
    return caller


def refuse_unreadable_mode(reader, mode: str | None) -> None:
    """422 naming ``mode`` for a mode that reads the answer slot's hidden state on an engine that does
    not return it (vLLM): no read of this service could be fitted or answered with it."""
    if mode in FEATURE_MODES and not reader.engine.capabilities.features:
        raise validation_error(
            ("body", "mode"),
            f"mode {mode} reads the model's hidden state at the answer slot, which the {reader.engine.kind} "
            "engine does not return (the local engine does)",
            "mode_unavailable",
        )


def stored(caller: Caller, calibration: Calibration, how: str) -> CalibrationOut:
    """Audit a stored fit (ids and sizes only: no domain tag, no example text) and render it."""
    audit(
        "calibration_stored", caller, how=how, calibration_id=calibration.id, shared=calibration.shared,
        model=calibration.model, question_type=calibration.question_type, option_count=calibration.option_count,
        mode=calibration.mode, n=calibration.n, source=calibration.source,
    )  # fmt: skip
    return calibration_out(calibration)


@router.post(
    "/v1/calibrations",
    response_model=CalibrationList,
    openapi_extra=body_schema(CalibrationRequest),
    responses=WRITE_ERRORS | error_responses(529),  # it reads examples, so admission may refuse it
)
async def create_calibrations(request: Request) -> CalibrationList:
    asker = require_scope(
        request.scope["state"], "calibrate", "POST /v1/calibrations"
    )  # before the body is read
    request.app.state.admission.refuse_if_full(
        asker.tenant
    )  # before the body is read and parsed: a flood costs no work
    reader, body = await parse_for_model(request, CalibrationRequest)
    caller = caller_for(request, "POST /v1/calibrations", shared=body.shared)
    refuse_unreadable_mode(reader, body.mode)

    reads = reader.for_tenant(caller.tenant, caller.cache_salt, "batch")

    def work():
        return fit_from_examples(
            body,
            reads,
            store_of(request),
            priors=request.app.state.priors,
            tenant=caller.tenant,
        )

    # Admitted by the cost of its reads, as /decide/batch is: an example set is as much work.
    jobs = [
        (lambda state=example.state: [content_text(state)], example.questions, ("body", "examples", i))
        for i, example in enumerate(body.examples)
    ]
    fitted = await unless_disconnected(request, admitted(request, reads, jobs, work))
    return CalibrationList(calibrations=[stored(caller, c, "examples") for c in fitted])


@router.get("/v1/calibrations", response_model=CalibrationList, responses=error_responses(401, 403))
async def list_calibrations(request: Request) -> CalibrationList:
    caller = caller_for(request, "GET /v1/calibrations")
    visible = store_of(request).calibrations(visible_to=caller.tenant)  # the cache: memory only
    return CalibrationList(calibrations=[calibration_out(c) for c in visible])


@router.post(
    "/v1/feedback",
    response_model=FeedbackResponse,
    openapi_extra=body_schema(FeedbackRequest),
    responses=error_responses(400, 401, 403, 404, 408, 413, 415, 422, 429),
)
async def feedback(request: Request) -> FeedbackResponse:
    caller = caller_for(request, "POST /v1/feedback")
    store = store_of(request)
    body = await parse_request(request, FeedbackRequest)
    # Another tenant's decision reads as None: the same 404, same message, as an id never recorded.
    decision = await asyncio.to_thread(store.decision, body.decision_id, caller.tenant)
    if decision is None:
        raise UnknownDecision(f"no decision {body.decision_id!r} is recorded here")
    try:
        gold = gold_index(decision.question_type, decision.options, body.gold)
    except ValueError as error:
        raise validation_error(("body", "gold"), str(error), "invalid_gold") from None
    recorded = await asyncio.to_thread(store.add_feedback, decision.id, decision.options[gold], caller.tenant)
    key = CalibrationKey(
        decision.model,
        decision.revision,
        decision.question_type,
        decision.option_count,
        decision.domain,
        read_version=decision.read_version,
        tenant=caller.tenant,
    )
    gold_answers = await asyncio.to_thread(store.feedback_count, key)
    refit = skipped = None
    every = request.app.state.auto_refit_every
    limits = request.app.state.refit_limits
    # Every N gold answers, or at the next feedback after a refit the limit skipped.
    due = every and gold_answers >= MIN_GOLD and (gold_answers % every == 0 or limits.owed(key))
    current = store.lookup(key)  # memory only
    # A key whose caller named its mode keeps it; one on the defaults (None) follows them at its new n.
    mode = refit_mode(current if current is not None and current.key == key else None)
    if due and not limits.take_automatic(key, mode or "default"):  # the defaults' own slot, as in refit()
        outcome, skipped = "skipped", "over the refit limit: the key is refitted at a later feedback"
    elif due:
        try:
            # Read again, with each decision's hidden state (a probe refit fits on it; only then worth reading).
            refitted = await asyncio.to_thread(refit_from_store, store, key, mode)
        except ValueError as error:
            # The feedback is stored either way; a refit its records cannot make (a caller's probe
            # over decisions read without the hidden state) leaves the key's fit as it is.
            outcome, skipped = "failed", str(error)
        else:
            outcome, refit = "made", stored(caller, refitted, "auto_refit")
    if due:
        request.app.state.metrics.automatic_refits.labels(outcome).inc()
    return FeedbackResponse(
        decision_id=decision.id,
        recorded=recorded,
        gold_answers=gold_answers,
        refit=refit,
        refit_skipped=skipped,
    )


@router.post(
    "/v1/calibrations/refit",
    response_model=CalibrationOut,
    openapi_extra=body_schema(RefitRequest),
    responses=WRITE_ERRORS,
)
async def refit(request: Request) -> CalibrationOut:
    require_scope(request.scope["state"], "calibrate", "POST /v1/calibrations/refit")
    reader = reader_of(request)
    store = store_of(request)
    body = await parse_request(request, RefitRequest)
    caller = caller_for(request, "POST /v1/calibrations/refit", shared=body.shared)
    refuse_unreadable_mode(reader, body.mode)
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
        read_version=read_version(
            CURRENT_LAYOUT.read_version_for(body.question_type, body.option_count or 0), corrected
        ),
        tenant=caller.tenant,
    )
    request.app.state.refit_limits.check(
        key, body.mode or "default"
    )  # 429 with Retry-After over the limit, before any work (no mode: the defaults' own slot)
    try:
        fitted = await asyncio.to_thread(refit_from_store, store, key, body.mode, shared=body.shared)
    except ValueError as error:
        raise validation_error(
            ("body",),
            str(error),
            "not_enough_decisions" if body.mode == "state_prior" else "not_enough_feedback",
        ) from None
    return stored(caller, fitted, "refit")
