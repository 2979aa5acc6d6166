"""Routes for operators, not clients: Prometheus metrics, liveness and readiness.

``/healthz`` and ``/readyz`` need no API key (orchestrators' probes carry none); ``/metrics`` needs one
when keys are on (Prometheus sends it as ``authorization: {credentials: …}``).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.openapi import error_responses
from service.protocol import ResponseModel
from service.state import reader_of

router = APIRouter()


class Live(ResponseModel):
    status: Literal["ok"]


class Ready(ResponseModel):
    status: Literal["ready"]
    model: str
    engine: str


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus exposition",
        },
        **error_responses(401),
    },
)
async def prometheus_metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.exposition()
    return Response(body, media_type=content_type)


@router.get("/healthz", response_model=Live)
async def live() -> Live:
    """The process serves HTTP; says nothing about the engine (a restart would not fix a slow engine)."""
    return Live(status="ok")


@router.get("/readyz", response_model=Ready, responses=error_responses(503))
async def ready(request: Request) -> Ready:
    """200 once the engine is open; else the 503 every decision would get, with its reason."""
    engine = reader_of(request).engine
    return Ready(status="ready", model=engine.info.name, engine=engine.kind)
