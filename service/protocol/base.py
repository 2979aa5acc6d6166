"""Base classes of every wire model: the unknown-field policy lives here, once.

Requests forbid unknown fields, and each rule is one named validator raising with the field, so a
bad request is a 422 naming it, never a 500.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

Content = str | dict[str, Any] | list[Any]
"""Text, a JSON object or an array, as Jev accepts for state, instructions and criteria."""


class RequestModel(BaseModel):
    """Request-side policy: unknown fields are an error naming the field."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def described(value: Content | None) -> bool:
    """Whether a description says anything (null, "", {} and [] say nothing)."""
    return value is not None and value != "" and value != {} and value != []

