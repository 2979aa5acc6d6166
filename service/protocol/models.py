"""``GET /v1/models`` and the error body every non-validation error shares."""

from __future__ import annotations

from typing import Literal

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
    message: str
    type: str
    param: str | None = None
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool | None = None
    context_length: int | None = None


class ErrorResponse(ResponseModel):
    """Every non-validation error. Validation errors keep FastAPI's (and Jev's) ``detail`` list."""

    detail: ErrorDetail
