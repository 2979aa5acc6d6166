"""Routes for operators, not clients: Prometheus metrics, liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.state import reader_of

router = APIRouter(include_in_schema=False)


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.exposition()
    return Response(body, media_type=content_type)


@router.get("/healthz")
async def live() -> JSONResponse:
    """The process serves HTTP; says nothing about the engine (a restart would not fix a slow engine)."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def ready(request: Request) -> JSONResponse:
    """200 once the engine is open; else the 503 every decision would get, with its reason."""
    engine = reader_of(request).engine
    return JSONResponse({"status": "ready", "model": engine.info.name, "engine": engine.kind})
