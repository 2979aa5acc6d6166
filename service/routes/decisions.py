"""``POST /v1/systemone`` (= ``POST /decide``) and ``POST /decide/batch``: Jev's own wire format.

The bodies are already Jev's request, so both routes are the shared decision path as it is
(``service/decision_route.py``: scope, admission by cost, cancellation, metrics).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.decision_route import serve_decisions
from service.openapi import body_schema, error_responses
from service.protocol import BatchRequest, BatchResponse, SystemOneRequest, SystemOneResponse

router = APIRouter()

DECISION_ERRORS = error_responses(400, 401, 403, 408, 413, 415, 422, 429, 502, 503, 504, 529)


async def answer(request: Request) -> JSONResponse:
    return await serve_decisions(request, SystemOneRequest)


async def answer_batch(request: Request) -> JSONResponse:
    return await serve_decisions(request, BatchRequest)


for path in ("/v1/systemone", "/decide"):
    router.add_api_route(
        path,
        answer,
        methods=["POST"],
        response_model=SystemOneResponse,
        openapi_extra=body_schema(SystemOneRequest, with_image_parts=True),
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
