"""The HTTP service: Jev's ``/v1/systemone`` (also ``/decide``) and ``/v1/models``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.middleware import Middleware

from readers.engines.base import Engine
from readers.errors import DecideError, EngineError, EngineUnavailable, InvalidQuestion, PromptTooLong, UnknownDecision
from readers.reader import Reader
from calibration.store import CalibrationKey, CalibrationStore
from service.calibrate import MIN_LABELS, fit_and_store, fit_from_examples, gold_index
from service.decide import JEV_ALIASES, decide, decide_batch
from service.decompress import DEFAULT_MAX_BODY_BYTES, DecompressMiddleware
from service.protocol import (
    BatchRequest,
    BatchResponse,
    CalibrationList,
    CalibrationOut,
    CalibrationRequest,
    FeedbackRequest,
    FeedbackResponse,
    RefitRequest,
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
    SystemOneRequest,
    SystemOneResponse,
)
from service.metrics import ServiceMetrics
from service.observe import ObserveMiddleware
from service.request_id import RequestIdMiddleware

logger = logging.getLogger("opendecide.service")

EngineOpener = Callable[[], Awaitable[Engine]]
RequestT = TypeVar("RequestT", SystemOneRequest, BatchRequest, CalibrationRequest, FeedbackRequest, RefitRequest)


class DuplicateKey(ValueError):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys silently; two options with one name are a client bug.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _validation_error(loc: tuple, message: str, error_type: str, value: Any = None) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": message, "type": error_type, "input": value}])


def parse_decision_request(body: bytes, model: type[RequestT] = SystemOneRequest) -> RequestT:
    """Bytes → validated request, every failure a 422 whose ``loc`` names the field."""
    try:
        payload = json.loads(body, object_pairs_hook=_reject_duplicate_keys)
    except DuplicateKey as error:
        raise _validation_error(("body",), str(error), "duplicate_key") from None
    except ValueError as error:
        raise _validation_error(("body",), f"body is not valid JSON: {error}", "json_invalid") from None
    except RecursionError:
        raise _validation_error(("body",), "body nests JSON too deeply", "json_invalid") from None
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        # Jev keeps the question type in the path, as pydantic does: body.questions.q.score.criteria.
        raise RequestValidationError([{**item, "loc": ("body", *item["loc"])} for item in error.errors(include_url=False)]) from None


def _error_response(error: DecideError) -> JSONResponse:
    detail = ErrorDetail(message=error.message, type=error.error_type, param=error.param)
    headers = {}
    if isinstance(error, PromptTooLong):
        detail.prompt_tokens, detail.context_length = error.prompt_tokens, error.context_length
        detail.prompt_tokens_exact = error.exact_count
    if isinstance(error, EngineUnavailable):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, InvalidQuestion):
        # Same shape as schema errors: the field is in ``loc``.
        content = {"detail": [{"loc": list(error.loc), "msg": error.message, "type": error.error_type}]}
        return JSONResponse(content, status_code=error.status_code)
    body = ErrorResponse(detail=detail).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=error.status_code, headers=headers)


async def _open_until_ready(app: FastAPI, open_engine: EngineOpener, *, first_wait_s: float = 1.0, max_wait_s: float = 30.0) -> None:
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
) -> FastAPI:
    """The service around one engine: pass it built, or ``open_engine`` to build it at start-up.

    With a calibration ``store``, answers apply the most specific stored calibration, every decision
    is recorded for feedback, and the /v1/calibrations and /v1/feedback routes exist;
    ``auto_refit_every`` refits a key from its feedback every N labels.
    """
    if auto_refit_every is not None and auto_refit_every < 1:
        raise ValueError("auto_refit_every must be positive")
    if (engine is None) == (open_engine is None):
        raise ValueError("pass exactly one of engine and open_engine")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The engine opens in the background: until it answers (a vLLM server still loading, a model
        # still converting) requests get 503 with the reason, instead of the service failing to start.
        task = asyncio.create_task(_open_until_ready(app, open_engine)) if open_engine is not None else None
        try:
            yield
        finally:
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
        summary="Typed decisions with probabilities, in Jev's System One wire format.",
        lifespan=lifespan,
        middleware=[
            Middleware(RequestIdMiddleware),
            Middleware(ObserveMiddleware, metrics=metrics),
            Middleware(DecompressMiddleware, max_body_bytes=max_body_bytes),
        ],
    )
    app.state.metrics = metrics
    if engine is not None:
        app.state.reader = Reader(engine)
        metrics.set_engine(engine)

    @app.exception_handler(DecideError)
    async def on_decide_error(request: Request, error: DecideError) -> JSONResponse:
        metrics.observe_error(error.error_type)
        return _error_response(error)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s", request.url.path)
        detail = ErrorDetail(message=f"internal error ({type(error).__name__})", type="internal_error")
        return JSONResponse(ErrorResponse(detail=detail).model_dump(mode="json", exclude_none=True), status_code=500)

    def reader_of(request: Request) -> Reader:
        reader = getattr(request.app.state, "reader", None)
        if reader is None:
            reason = getattr(request.app.state, "engine_error", None) or "the engine is starting"
            raise EngineUnavailable(f"not ready: {reason}")
        return reader

    @app.get("/v1/models", response_model=ModelList)
    async def list_models(request: Request) -> ModelList:
        served = reader_of(request).engine
        card = ModelCard(
            name=served.info.name,
            description=served.info.description,
            release_date=served.info.release_date,
            revision=served.info.revision,
            engine=served.kind,
            read_mode=served.capabilities.read_mode.value,
            max_logprobs=served.capabilities.max_logprobs,
            top_k=served.capabilities.top_k,
            context_length=served.info.context_length,
            aliases=list(JEV_ALIASES),
        )
        return ModelList(models=[card])

    def schema_of(model: type) -> dict:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    errors = {code: {"model": ErrorResponse} for code in (413, 502, 503, 504)}

    async def validated(request: Request, model: type[RequestT]) -> tuple[Reader, RequestT]:
        reader = reader_of(request)
        decision = parse_decision_request(await request.body(), model)
        served = reader.engine.info.name
        if decision.model not in (None, served, *JEV_ALIASES):
            raise _validation_error(
                ("body", "model"), f"unknown model {decision.model!r}; this server serves {served!r}", "unknown_model", decision.model
            )
        return reader, decision

    def observed(request: Request, model: str, answer_sets) -> None:
        """Per-question metrics, and the model and decision ids for the access log."""
        ids = request.scope["state"].setdefault("decision_ids", [])
        request.scope["state"]["model"] = model
        for answers in answer_sets:
            for answer in answers.values():
                metrics.observe_answer(model, answer.type, answer.reading)
                ids.append(answer.reading.decision_id)

    async def answer(request: Request) -> JSONResponse:
        reader, decision = await validated(request, SystemOneRequest)
        response = await decide(decision, reader, request_id=request.scope["state"]["request_id"], store=store)
        observed(request, response.model, [response.answers])
        return JSONResponse(response.model_dump(mode="json"))

    async def answer_batch(request: Request) -> JSONResponse:
        reader, decision = await validated(request, BatchRequest)
        response = await decide_batch(decision, reader, request_id=request.scope["state"]["request_id"], store=store)
        observed(request, response.model, [result.answers for result in response.results])
        return JSONResponse(response.model_dump(mode="json"))

    for path in ("/v1/systemone", "/decide"):
        app.add_api_route(
            path, answer, methods=["POST"], response_model=SystemOneResponse, openapi_extra=schema_of(SystemOneRequest), responses=errors
        )
    app.add_api_route(
        "/decide/batch", answer_batch, methods=["POST"], response_model=BatchResponse, openapi_extra=schema_of(BatchRequest), responses=errors
    )
    if store is not None:
        add_calibration_routes(app, store, reader_of=reader_of, validated=validated, auto_refit_every=auto_refit_every)
    return app


def add_calibration_routes(app: FastAPI, store: CalibrationStore, *, reader_of, validated, auto_refit_every: int | None) -> None:
    def out(calibration) -> CalibrationOut:
        return CalibrationOut(**calibration.as_json())

    @app.post("/v1/calibrations", response_model=CalibrationList)
    async def create_calibrations(request: Request) -> CalibrationList:
        reader, body = await validated(request, CalibrationRequest)
        fitted = await fit_from_examples(body, reader, store)
        return CalibrationList(calibrations=[out(c) for c in fitted])

    @app.get("/v1/calibrations", response_model=CalibrationList)
    async def list_calibrations() -> CalibrationList:
        return CalibrationList(calibrations=[out(c) for c in store.calibrations()])

    @app.post("/v1/feedback", response_model=FeedbackResponse)
    async def feedback(request: Request) -> FeedbackResponse:
        body = parse_decision_request(await request.body(), FeedbackRequest)
        decision = await asyncio.to_thread(store.decision, body.decision_id)
        if decision is None:
            raise UnknownDecision(f"no decision {body.decision_id!r} is recorded here")
        try:
            gold = gold_index(decision.question_type, decision.options, body.gold)
        except ValueError as error:
            raise _validation_error(("body", "gold"), str(error), "invalid_gold", body.gold) from None
        recorded = await asyncio.to_thread(store.add_feedback, decision.id, decision.options[gold])
        key = CalibrationKey(decision.model, decision.revision, decision.question_type, decision.option_count, decision.domain)
        labelled = await asyncio.to_thread(store.labelled, key)
        refit = None
        if auto_refit_every and len(labelled) >= MIN_LABELS and len(labelled) % auto_refit_every == 0:
            refit = out(await asyncio.to_thread(fit_and_store, store, key, labelled, source="feedback"))
        return FeedbackResponse(decision_id=decision.id, recorded=recorded, labelled=len(labelled), refit=refit)

    @app.post("/v1/calibrations/refit", response_model=CalibrationOut)
    async def refit(request: Request) -> CalibrationOut:
        reader = reader_of(request)
        body = parse_decision_request(await request.body(), RefitRequest)
        info = reader.engine.info
        key = CalibrationKey(info.name, info.revision, body.question_type, body.option_count, body.domain)
        labelled = await asyncio.to_thread(store.labelled, key)
        try:
            fitted = await asyncio.to_thread(fit_and_store, store, key, labelled, source="feedback")
        except ValueError as error:
            raise _validation_error(("body",), str(error), "not_enough_feedback") from None
        return out(fitted)
