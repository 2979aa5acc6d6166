"""Routes for operators, not clients: Prometheus metrics, liveness and readiness, the key set.

``/healthz`` and ``/readyz`` need no API key (orchestrators' probes carry none). On the main port
``/metrics`` and ``/v1/keys`` need a key with the ``admin`` scope when keys are on (the metrics name
models and counts every tenant's traffic); ``decide serve --metrics-port`` serves ``/metrics`` alone on
its own listener without a key (``metrics_app``), for a scraper that reaches only that port.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from service.auth import require_scope
from service.metrics import ServiceMetrics
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
        **error_responses(401, 403),
    },
)
async def prometheus_metrics(request: Request) -> Response:
    require_scope(request.scope["state"], "admin", "GET /metrics on the main port")
    return exposition(request.app.state.metrics)


def exposition(metrics: ServiceMetrics) -> Response:
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)


def metrics_app(metrics: ServiceMetrics) -> FastAPI:
    """``/metrics`` alone, for its own listener (``--metrics-port``): no key, no other route, so a port
    opened to the scraper exposes nothing else."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.add_api_route("/metrics", lambda: exposition(metrics), methods=["GET"], response_class=Response)
    return app


class KeyOut(ResponseModel):
    key_id: str
    tenant: str
    scopes: list[str]


class KeySetOut(ResponseModel):
    keys: list[KeyOut]


@router.get("/v1/keys", response_model=KeySetOut, responses=error_responses(401, 403))
async def key_set(request: Request) -> KeySetOut:
    """The keys in use, by id (never a key), with their tenants and scopes: to check a rotation took."""
    require_scope(request.scope["state"], "admin", "GET /v1/keys")
    keyring = request.app.state.keyring
    return KeySetOut(keys=[KeyOut(**key) for key in (keyring.current.describe() if keyring else [])])


@router.get("/healthz", response_model=Live)
async def live() -> Live:
    """The process serves HTTP; says nothing about the engine (a restart would not fix a slow engine)."""
    return Live(status="ok")


@router.get("/readyz", response_model=Ready, responses=error_responses(503))
async def ready(request: Request) -> Ready:
    """200 once the engine is open; else the 503 every decision would get, with its reason."""
    engine = reader_of(request).engine
    return Ready(status="ready", model=engine.info.name, engine=engine.kind)
