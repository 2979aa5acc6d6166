"""The HTTP service: ``create_app`` assembles middleware, error handlers and routers; nothing else.

The middlewares live in ``service/middleware/``, one module each, and are stacked here in one list.
Routes live in ``service/routes/`` (decisions, openai_decisions, google_decisions, models, calibrations,
operations);
every decision route takes the one path in ``service/decision_route.py``; what routes share is on
``app.state`` (``service/state.py``). The decisions themselves are the pipeline's
(``service/pipeline/``), which imports no web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from calibration.store import CalibrationStore
from readers.engines.base import Engine
from readers.errors import DecideError, EngineError
from readers.reader import Reader
from service.admission import Admission, AdmissionLimits
from service.errors import (
    ERROR_SHAPES,
    error_response,
    error_shape,
    internal_error_response,
    validation_response,
)
from service.keys import Keyring, watch_key_file
from service.metrics import ServiceMetrics
from service.middleware.auth import AuthMiddleware
from service.middleware.decompress import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    ROUTE_BODY_LIMITS,
    DecompressMiddleware,
)
from service.middleware.error_shape import ErrorShapeMiddleware
from service.middleware.google_paths import GooglePathsMiddleware
from service.middleware.json_body import JsonBodyMiddleware
from service.middleware.observe import ObserveMiddleware
from service.middleware.rate_limit import RateLimitMiddleware
from service.middleware.request_id import RequestIdMiddleware
from service.openapi import complete_openapi
from service.parse import ParseSlots
from service.pipeline.images import ServedImages
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION, OptionPriors, PriorCorrection
from service.refit_limits import RefitLimits
from service.retention import prune_periodically
from service.routes import calibrations, decisions, google_decisions, models, openai_decisions, operations

logger = logging.getLogger("opendecide.service")

EngineOpener = Callable[[], Awaitable[Engine]]


async def _open_until_ready(
    app: FastAPI,
    open_engine: EngineOpener,
    on_failure: Callable[[str], None] | None = None,
    *,
    first_wait_s: float = 1.0,
    max_wait_s: float = 30.0,
) -> None:
    wait = first_wait_s
    while True:
        try:
            app.state.reader = Reader(await open_engine())
            app.state.engine_error = None
            app.state.metrics.set_engine(app.state.reader.engine)
            logger.info("engine ready: %s", app.state.reader.engine.info.name)
            return
        except (EngineError, OSError) as error:  # not up yet: try again
            app.state.engine_error = str(getattr(error, "message", error))
            logger.warning("engine not ready (%s); retrying in %.0f s", app.state.engine_error, wait)
        except Exception as error:  # a configuration mistake: retrying cannot fix it
            app.state.engine_error = f"engine failed to open: {error}"
            logger.exception("engine failed to open; requests will get 503")
            if on_failure is not None:
                on_failure(app.state.engine_error)
            return
        await asyncio.sleep(wait)
        wait = min(wait * 2, max_wait_s)


def create_app(
    engine: Engine | None = None,
    *,
    open_engine: EngineOpener | None = None,
    store: CalibrationStore | None = None,
    auto_refit_every: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_limits: Mapping[str, int] = ROUTE_BODY_LIMITS,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    images: ServedImages = ServedImages(),
    api_keys: Keyring | list[str] | None = None,
    rate_limit: tuple[float, int] | None = None,
    admission: AdmissionLimits = AdmissionLimits(),
    retention: dt.timedelta | None = None,
    prior_correction: PriorCorrection = DEFAULT_PRIOR_CORRECTION,
    on_engine_failure: Callable[[str], None] | None = None,
    refit_limits: RefitLimits | None = None,
) -> FastAPI:
    """The service around one engine: pass it built, or ``open_engine`` to build it at start-up.

    With a calibration ``store``, answers apply the most specific stored calibration, every decision
    is recorded for feedback, and the /v1/calibrations and /v1/feedback routes exist;
    ``auto_refit_every`` refits a key from its feedback every N gold answers. ``images`` names the
    serving images, reported in every answer's provenance. ``api_keys`` turns authentication on
    (None: off): a ``Keyring`` (live: its file is watched and re-read on SIGHUP) or bare keys (tenant
    default); ``rate_limit`` is (requests per second, burst) per key; ``admission`` bounds the
    prompt tokens in flight and queued. ``max_body_bytes`` is the decoded body limit of a path not in
    ``body_limits`` (path → bytes; default ``service/middleware/decompress.py:ROUTE_BODY_LIMITS``,
    64 KiB for feedback and refits, 4 MiB for examples). ``retention`` deletes decision records without
    gold answers older than it (hourly, from start-up); None keeps them. Superseded calibrations beyond
    each key's latest ``store.keep_fits`` are pruned hourly either way. ``refit_limits``: how often a
    tenant may refit (``service/refit_limits.py``; default one per key every 5 s, 30 a minute per
    tenant). ``prior_correction``: which questions' reads that no stored calibration covers get their
    content-free option prior divided out
    (``service/pipeline/prior.py``; default choice and score questions). ``on_engine_failure(reason)`` is called
    when ``open_engine`` fails in a way retrying cannot fix (``decide serve`` then exits non-zero).
    """
    if auto_refit_every is not None and auto_refit_every < 1:
        raise ValueError("auto_refit_every must be positive")
    if (engine is None) == (open_engine is None):
        raise ValueError("pass exactly one of engine and open_engine")
    keyring = (
        None if api_keys is None else api_keys if isinstance(api_keys, Keyring) else Keyring.of(api_keys)
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The engine opens in the background: until it answers (a vLLM server still loading, a model
        # still converting) requests get 503 with the reason, instead of the service failing to start.
        task = (
            asyncio.create_task(_open_until_ready(app, open_engine, on_engine_failure))
            if open_engine is not None
            else None
        )
        pruning = (
            asyncio.create_task(prune_periodically(store, retention or None)) if store is not None else None
        )
        # Only a key file can change under a running process; keys given in code or the environment cannot.
        watching = watch_key_file(keyring) if keyring is not None and keyring.path is not None else None
        try:
            yield
        finally:
            if watching is not None:
                watching()
            if pruning is not None:
                pruning.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pruning
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            reader = getattr(app.state, "reader", None)
            if task is not None and reader is not None:
                await reader.engine.aclose()

    metrics = ServiceMetrics()
    app = FastAPI(
        title="opendecide",
        summary="Typed decisions with probabilities, in Jev's System One, OpenAI's and Google's Decisions wire formats.",
        lifespan=lifespan,
        # Outermost first: a Google client's path is settled before anything reads it; every request
        # gets an id and is observed, refusals included; auth and rate limits answer before a body
        # is read.
        middleware=[
            Middleware(GooglePathsMiddleware),
            Middleware(RequestIdMiddleware),
            Middleware(ObserveMiddleware, metrics=metrics),
            Middleware(ErrorShapeMiddleware, shapes=ERROR_SHAPES),
            Middleware(AuthMiddleware, keys=keyring),
            *(
                [Middleware(RateLimitMiddleware, requests_per_s=rate_limit[0], burst=rate_limit[1])]
                if rate_limit
                else []
            ),
            Middleware(JsonBodyMiddleware),
            Middleware(
                DecompressMiddleware,
                max_body_bytes=max_body_bytes,
                body_limits=body_limits,
                body_timeout_s=body_timeout_s,
            ),
        ],
    )
    app.openapi = lambda: complete_openapi(app)
    app.state.admission = Admission(admission)
    app.state.parse_slots = ParseSlots()
    app.state.metrics = metrics
    if store is not None:
        metrics.watch_probe_cache(store.probe_cache)
    app.state.store = store
    app.state.keyring = keyring
    app.state.auto_refit_every = auto_refit_every
    app.state.refit_limits = refit_limits or RefitLimits()
    app.state.images = images
    prior_correction = PriorCorrection(prior_correction)
    app.state.priors = None if prior_correction is PriorCorrection.OFF else OptionPriors(prior_correction)
    app.state.reader = None
    if engine is not None:
        app.state.reader = Reader(engine)
        metrics.set_engine(engine)

    @app.exception_handler(DecideError)
    async def on_decide_error(request: Request, error: DecideError) -> JSONResponse:
        metrics.observe_error(error.error_type)
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return validation_response(error)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s", request.url.path)
        response = internal_error_response(error)
        shape = error_shape(ERROR_SHAPES, request.url.path)
        if shape is not None:  # answered outside the middleware that reshapes the others
            status, body = shape(500, json.loads(response.body), {})
            return JSONResponse(body, status_code=status)
        return response

    for router in (
        decisions.router,
        openai_decisions.router,
        google_decisions.router,
        models.router,
        operations.router,
    ):
        app.include_router(router)
    if store is not None:
        app.include_router(calibrations.router)
    return app
