"""Base classes of every wire model: the unknown-field policy lives here, once.

Inside a request, unknown fields are an error naming the field (a misspelt ``criteria`` must not be
silently dropped). At the top level of a request body, unknown fields are ignored and logged by name:
Jev clients add their own fields there, and Jev ignores them. Each rule is one named validator
raising with the field, so a bad request is a 422 naming it, never a 500.

Our response extensions carry an ``x_`` prefix on the wire (``x_reading``, ``x_provenance``) so no
future Jev field can collide with them; in Python they keep their plain names.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

logger = logging.getLogger("opendecide.service")

MAX_LOGGED_FIELDS = 20
MAX_LOGGED_NAME = 64
MAX_ID_CHARS = 128
"""The longest id a request may carry (decision ids, tool call ids): an error that names an id
echoes at most this much of the caller's input. Ours are 36 characters (``dec_`` + 32 hex)."""

Content = str | dict[str, Any] | list[Any]
"""Text, a JSON object or an array, as Jev accepts for state, instructions and criteria."""


class RequestModel(BaseModel):
    """Request-side policy: unknown fields are an error naming the field."""

    model_config = ConfigDict(extra="forbid")


class BodyModel(RequestModel):
    """A whole request body: unknown top-level fields are ignored and their names logged, never echoed."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def log_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            unknown = [name for name in data if name not in known]
            if unknown:
                # Names only (ascii, cut short): the values may be anything, and never reach a log.
                names = [ascii(str(name)[:MAX_LOGGED_NAME]) for name in unknown[:MAX_LOGGED_FIELDS]]
                logger.info("ignored unknown request fields in %s: %s", cls.__name__, ", ".join(names))
        return data


class ResponseModel(BaseModel):
    """Response-side policy: fields serialise under their wire alias (``x_reading``) where one is set."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)


def described(value: Content | None) -> bool:
    """Whether a description says anything (null, "", {} and [] say nothing)."""
    return value is not None and value != "" and value != {} and value != []
