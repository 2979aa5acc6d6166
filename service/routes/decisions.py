"""``POST /v1/systemone`` (= ``POST /decide``) and ``POST /decide/batch``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.decide import decide, decide_batch
from service.parse import parse_for_model
from service.protocol import BatchRequest, BatchResponse, ErrorResponse, SystemOneRequest, SystemOneResponse

router = APIRouter()

ERRORS = {code: {"model": ErrorResponse} for code in (413, 502, 503, 504)}


def request_body(model: type) -> dict:
    """The OpenAPI request body of a route that parses its own body (to keep 422 ``loc``s exact)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


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
    reader, body = await parse_for_model(request, SystemOneRequest)
    state = request.app.state
    response = await decide(body, reader, request_id=request.scope["state"]["request_id"], store=state.store, images=state.images)
    observed(request, response.model, [response.answers])
    return JSONResponse(response.model_dump(mode="json"))


async def answer_batch(request: Request) -> JSONResponse:
    reader, body = await parse_for_model(request, BatchRequest)
    state = request.app.state
    response = await decide_batch(body, reader, request_id=request.scope["state"]["request_id"], store=state.store, images=state.images)
    observed(request, response.model, [result.answers for result in response.results])
    return JSONResponse(response.model_dump(mode="json"))


for path in ("/v1/systemone", "/decide"):
    router.add_api_route(
        path, answer, methods=["POST"], response_model=SystemOneResponse, openapi_extra=request_body(SystemOneRequest), responses=ERRORS
    )
router.add_api_route(
    "/decide/batch", answer_batch, methods=["POST"], response_model=BatchResponse, openapi_extra=request_body(BatchRequest), responses=ERRORS
)
