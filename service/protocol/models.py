"""``GET /v1/models`` (one body for Jev's and OpenAI's SDKs), the model names a client may send, and
the error body every non-validation error shares."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from service.protocol.base import ResponseModel

# Model names a client may send unchanged; each selects the model this server serves, so switching
# to this server changes a base URL and nothing else. Jev's: its moving aliases, its 1.14 release and
# 1.13's pinned and dated names. OpenAI's: the one model its Decisions API takes (/v1/decisions only).
# Google's: the one model its Decisions API takes, sent as models/gemini-decision-1 (/v1beta/decisions only).
JEV_ALIASES = ("jev-latest", "jev-preview", "jev-1.14.0", "jev-1.13.0", "jev-1.13-20260917")
OPENAI_ALIASES = ("gpt-6-luna",)
GOOGLE_ALIASES = ("gemini-decision-1",)


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
    reads_images: bool = Field(
        default=False,
        description="the served model reads images in decisions (the engine's start-up probe); false: image parts get a 400",
    )


class OpenAIModel(ResponseModel):
    """One name in OpenAI's list (``openai.types.Model``)."""

    id: str
    created: int = Field(description="the served model's release date, as Unix seconds")
    object: Literal["model"] = "model"
    owned_by: str = Field(description="who serves it: opendecide")


class ModelList(ResponseModel):
    """Jev's ``models`` and OpenAI's ``object``/``data`` side by side: each SDK reads its own fields
    and ignores the other's."""

    models: list[ModelCard]
    object: Literal["list"] = "list"
    data: list[OpenAIModel] = Field(description="the served model, then every alias it answers to")


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
