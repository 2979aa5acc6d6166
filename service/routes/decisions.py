"""``POST /v1/systemone`` (= ``POST /decide``) and ``POST /decide/batch``.

Each decision is admitted by its cost (``service/admission.py``) and cancelled if its client leaves
(``service/cancel.py``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.admission import admitted
from service.cancel import unless_disconnected
from service.openapi import body_schema, error_responses
from service.parse import parse_for_model
from service.pipeline.decide import decide, decide_batch
from service.protocol import BatchRequest, BatchResponse, SystemOneRequest, SystemOneResponse
from service.scopes import require_scope

router = APIRouter()

DECISION_ERRORS = error_responses(400, 401, 403, 408, 413, 415, 422, 429, 502, 503, 504, 529)


def observed(request: Request, model: str, answer_sets) -> None:
    """Per-question metrics, and the model and decision ids for the access log."""
    metrics = request.app.state.metrics
    ids = request.scope["state"].setdefault("decision_ids", [])
    request.scope["state"]["model"] = model
    for answers in answer_sets:
        for answer in answers.values():
            metrics.observe_answer(model, answer.type, answer.reading)
            ids.append(answer.reading.decision_id)


async def answer(request: Request) -> JSONResponse:
    caller = require_scope(request.scope["state"], "decide", f"POST {request.url.path}")
    request.app.state.admission.refuse_if_full()  # before the body is read and parsed: a flood costs no work
    reader, body = await parse_for_model(request, SystemOneRequest)
    state = request.app.state
    request_id = request.scope["state"]["request_id"]

    async def work():
        return await decide(
            body, reader, request_id=request_id, store=state.store, images=state.images, priors=state.priors,
            tenant=caller.tenant,
        )  # fmt: skip

    jobs = [([body.state_text()], body.questions, ("body",))]
    response = await unless_disconnected(request, admitted(request, reader, jobs, work))
    observed(request, response.model, [response.answers])
    return JSONResponse(response.model_dump(mode="json"))


async def answer_batch(request: Request) -> JSONResponse:
    caller = require_scope(request.scope["state"], "decide", "POST /decide/batch")
    request.app.state.admission.refuse_if_full()  # before the body is read and parsed: a flood costs no work
    reader, body = await parse_for_model(request, BatchRequest)
    state = request.app.state
    request_id = request.scope["state"]["request_id"]

    async def work():
        return await decide_batch(
            body, reader, request_id=request_id, store=state.store, images=state.images, priors=state.priors,
            tenant=caller.tenant,
        )  # fmt: skip

    states = [one.state_text() for one in body.requests()]
    jobs = [(states, body.questions, ("body",))]
    response = await unless_disconnected(request, admitted(request, reader, jobs, work))
    observed(request, response.model, [result.answers for result in response.results])
    return JSONResponse(response.model_dump(mode="json"))


for path in ("/v1/systemone", "/decide"):
    router.add_api_route(
        path,
        answer,
        methods=["POST"],
        response_model=SystemOneResponse,
        openapi_extra=body_schema(SystemOneRequest),
        responses=DECISION_ERRORS,
    )
router.add_api_route(
    "/decide/batch",
    answer_batch,
    methods=["POST"],
    response_model=BatchResponse,
    openapi_extra=body_schema(BatchRequest),
    responses=DECISION_ERRORS,
)
