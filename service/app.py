"""The HTTP service: Jev's ``/v1/systemone`` (also ``/decide``) and ``/v1/models``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.middleware import Middleware

from readers.engines.base import Engine
from readers.errors import DecideError, EngineUnavailable, InvalidQuestion, PromptTooLong
from readers.reader import Reader
from service.decide import JEV_ALIASES, decide
from service.decompress import DEFAULT_MAX_BODY_BYTES, DecompressMiddleware
from service.protocol import ErrorDetail, ErrorResponse, ModelCard, ModelList, SystemOneRequest, SystemOneResponse
from service.request_id import RequestIdMiddleware

EngineOpener = Callable[[], Awaitable[Engine]]


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


def parse_decision_request(body: bytes) -> SystemOneRequest:
    """Bytes → validated request, every failure a 422 whose ``loc`` names the field."""
    try:
        payload = json.loads(body, object_pairs_hook=_reject_duplicate_keys)
    except DuplicateKey as error:
        raise _validation_error(("body",), str(error), "duplicate_key") from None
    except ValueError as error:
        raise _validation_error(("body",), f"body is not valid JSON: {error}", "json_invalid") from None
    try:
        return SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise RequestValidationError(
            [{**item, "loc": ("body", *_without_tag(item["loc"]))} for item in error.errors(include_url=False)]
        ) from None


def _without_tag(loc: tuple) -> tuple:
    # pydantic puts the union tag in the path (questions.q.choice.criteria); the field is questions.q.criteria.
    if len(loc) > 2 and loc[0] == "questions" and loc[2] in ("noul", "choice", "score"):
        return (*loc[:2], *loc[3:])
    return loc


def _error_response(error: DecideError) -> JSONResponse:
    detail = ErrorDetail(message=error.message, type=error.error_type, param=error.param)
    headers = {}
    if isinstance(error, PromptTooLong):
        detail.prompt_tokens, detail.context_length = error.prompt_tokens, error.context_length
    if isinstance(error, EngineUnavailable):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, InvalidQuestion):
        # Same shape as schema errors: the field is in ``loc``.
        content = {"detail": [{"loc": list(error.loc), "msg": error.message, "type": error.error_type}]}
        return JSONResponse(content, status_code=error.status_code)
    body = ErrorResponse(detail=detail).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=error.status_code, headers=headers)


def create_app(
    engine: Engine | None = None,
    *,
    open_engine: EngineOpener | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The service around one engine: pass it built, or ``open_engine`` to build it at start-up."""
    if (engine is None) == (open_engine is None):
        raise ValueError("pass exactly one of engine and open_engine")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened = None
        if open_engine is not None:
            opened = await open_engine()
            app.state.reader = Reader(opened)
        try:
            yield
        finally:
            if opened is not None:
                await opened.aclose()

    app = FastAPI(
        title="opendecide",
        summary="Typed decisions with probabilities, in Jev's System One wire format.",
        lifespan=lifespan,
        middleware=[
            Middleware(RequestIdMiddleware),
            Middleware(DecompressMiddleware, max_body_bytes=max_body_bytes),
        ],
    )
    if engine is not None:
        app.state.reader = Reader(engine)

    @app.exception_handler(DecideError)
    async def on_decide_error(request: Request, error: DecideError) -> JSONResponse:
        return _error_response(error)

    def reader_of(request: Request) -> Reader:
        reader = getattr(request.app.state, "reader", None)
        if reader is None:
            raise EngineUnavailable("the engine is starting")
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

    request_schema = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": SystemOneRequest.model_json_schema(ref_template="#/components/schemas/{model}")}},
        }
    }

    async def answer(request: Request) -> JSONResponse:
        reader = reader_of(request)
        decision = parse_decision_request(await request.body())
        served = reader.engine.info.name
        if decision.model not in (None, served, *JEV_ALIASES):
            raise _validation_error(
                ("body", "model"), f"unknown model {decision.model!r}; this server serves {served!r}", "unknown_model", decision.model
            )
        response = await decide(decision, reader, request_id=request.scope["state"]["request_id"])
        return JSONResponse(response.model_dump(mode="json"))

    for path in ("/v1/systemone", "/decide"):
        app.add_api_route(
            path,
            answer,
            methods=["POST"],
            response_model=SystemOneResponse,
            openapi_extra=request_schema,
            responses={413: {"model": ErrorResponse}, 502: {"model": ErrorResponse}, 503: {"model": ErrorResponse}, 504: {"model": ErrorResponse}},
        )
    return app
