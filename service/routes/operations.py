"""Routes for operators, not clients: Prometheus metrics, liveness and readiness, the key set.

``/healthz`` and ``/readyz`` need no API key (orchestrators' probes carry none). On the main port
``/metrics`` and ``/v1/keys`` need a key with the ``admin`` scope when keys are on (the metrics name
models and counts every tenant's traffic); ``decide serve --metrics-port`` serves ``/metrics`` alone on
its own listener without a key (``metrics_app``), for a scraper that reaches only that port.

Readiness is probed, not assumed: an engine that opened once can go away (a vLLM server stopped or
killed), and a service that says ready while every decision gets 503 keeps receiving traffic. The
probe is one real one-token read through the engine, so it takes the path a decision takes; its
outcome is kept ``READY_CACHE_S`` so probes from many replicas' orchestrators cost one read, and
concurrent probes share it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import Field

from readers.engines.base import ReadRequest
from readers.errors import EngineTimeout, EngineUnavailable
from readers.reader import Reader
from service.metrics import ServiceMetrics
from service.openapi import error_responses
from service.protocol import ResponseModel
from service.scopes import require_scope
from service.state import reader_of

READY_CACHE_S = 2.0
READY_PROGRESS_S = 5.0
"""A probe that times out still says ready if a decision's read completed this recently."""
PROBE_TIMEOUT_S = 3.0
"""Seconds the probe's read may take: under the orchestrator's own probe timeout (5 s in
deploy/k8s/base/service-deployment.yaml), so a probe behind a long read answers (busy = ready) before
the kubelet gives up on it and counts a failure."""

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
    weight: float
    tokens_per_minute: int | None
    cache_group: str | None = Field(
        description="the key file's cache_group=: the prompt-cache group its tenant shares (None: the tenant's own)"
    )


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
    """200 while the engine is open and answers a read; else the 503 every decision would get, with
    its reason."""
    reader = reader_of(request)
    state = request.app.state
    probe = getattr(state, "readiness_probe", None)
    if probe is None or probe.reader is not reader or probe.expired():
        probe = state.readiness_probe = EngineProbe(reader)
    await probe.outcome()
    return Ready(status="ready", model=reader.engine.info.name, engine=reader.engine.kind)


class EngineProbe:
    """One one-token read through ``reader``'s engine, its outcome kept for ``READY_CACHE_S``.

    A probe that times out is still ready if the engine completed a read for a decision within the
    last ``READY_PROGRESS_S`` (``Reader.progress``): a busy engine that keeps finishing work is alive,
    its probe queued behind that work. Reads in flight prove nothing: a hung engine holds them for
    its whole timeout, and decisions get 504 meanwhile. So an engine that stops answering under load
    turns /readyz 503 within ``READY_PROGRESS_S`` + ``PROBE_TIMEOUT_S``."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self._started = time.monotonic()
        self._task = asyncio.ensure_future(self._read())

    def expired(self) -> bool:
        return self._task.done() and time.monotonic() - self._started > READY_CACHE_S

    async def outcome(self) -> None:
        """Return if the engine answered; raise the 503 a decision would get if not."""
        await asyncio.shield(self._task)

    def _recently_completed(self) -> bool:
        since = self.reader.progress.seconds_since()
        return since is not None and since <= READY_PROGRESS_S

    async def _read(self) -> None:
        engine = self.reader.engine
        token = self.reader.template.encode_text("ok")[:1] or (0,)
        request = ReadRequest(
            prompt_ids=tuple(token), label_ids=tuple(token), label_texts=("ok",), keep=False
        )
        try:
            await asyncio.wait_for(engine.read(request), PROBE_TIMEOUT_S)
        except TimeoutError:
            if not self._recently_completed():
                raise EngineUnavailable(
                    f"not ready: the engine did not answer a one-token read within {PROBE_TIMEOUT_S:g} s "
                    f"and completed no read in the last {READY_PROGRESS_S:g} s"
                ) from None
        except EngineTimeout as error:
            if not self._recently_completed():
                raise EngineUnavailable(f"not ready: {error.message}") from None
        except Exception as error:  # any failure to read is a reason not to take traffic
            raise EngineUnavailable(f"not ready: {getattr(error, 'message', None) or error!r}") from None
