"""``GET /v1/models`` and the error body every non-validation error shares."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from service.protocol.base import ResponseModel


class ModelCard(ResponseModel):
    name: str
    description: str
    release_date: str
    # -- opendecide extensions
    revision: str
    engine: str
    read_mode: Literal["exact", "masked", "topk"]
    max_logprobs: int
    top_k: int
    context_length: int
    aliases: list[str]


class ModelList(ResponseModel):
    models: list[ModelCard]


class ErrorDetail(ResponseModel):
    error_type: str = Field(
        description="machine-readable: authentication_error, rate_limit_error, overloaded_error, engine_unavailable, …"
    )
    message: str = Field(
        description="what went wrong and, where it helps, the limit or field involved; never request text"
    )
    param: str | None = Field(default=None, description="the field or header the error is about")
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool | None = None
    context_length: int | None = None
    limit: int | None = Field(default=None, description="the limit a 413 refers to")


class ErrorResponse(ResponseModel):
    """Every non-validation error. Validation errors keep FastAPI's (and Jev's) ``detail`` list."""

    detail: ErrorDetail


class ValidationItem(ResponseModel):
    loc: list[str | int] = Field(description="where: body, then field names and indices")
    msg: str
    type: str


class ValidationErrorResponse(ResponseModel):
    """A 422: every problem found, each naming its field (Jev's and FastAPI's shape, without ``input``)."""

    detail: list[ValidationItem]
