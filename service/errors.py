"""Errors of the service itself, and how every error becomes an HTTP response.

    DecideError (readers/errors.py; engine errors 502/503/504, prompt_too_long 413, …)
    ├── UnknownDecision (404 unknown_decision)      feedback for a decision id never recorded (or another tenant's)
    ├── PermissionDenied (403 permission_error)     the key lacks the scope the route needs
    ├── RequestTooCostly (413 request_too_large)    tokens to compute over the per-request cap or deadline
    ├── Overloaded (529 overloaded_error)           the admission queue is full or too slow; Retry-After
    ├── TenantLimited (429 rate_limit_error)        a tenant at its own limit (queue, tokens a minute, refits); Retry-After
    ├── UnsupportedFeature (400 unsupported_feature) a Jev 1.14 Danger-Zone header (service/parse.py)
    ├── DeadlineExceeded (504 deadline_exceeded)    the request ran past the server's deadline
    ├── NotUtf8 (415 unsupported_media_type)        a JSON body that is not UTF-8 (UTF-16, Latin-1)
    └── ClientDisconnected (never sent)             the client left; its work was cancelled

Middleware (``service/middleware/``) answers before any route, with ``send_error``:

    401 authentication_error   missing or wrong API key            (middleware/auth.py)
    429 rate_limit_error       the key's token bucket is empty     (middleware/rate_limit.py)
    408 request_timeout        the body did not arrive in time     (middleware/decompress.py)
    413 body_too_large         the (decoded) body is over the limit
    415 unsupported_media_type not application/json, or an unknown Content-Encoding
    400 bad_encoding           a body that does not decode

Validation errors keep FastAPI's (and Jev's) ``{"detail": [{"loc", "msg", "type"}]}`` shape, without
``input`` (it may hold state text). Every other error is ``{"detail": {"error_type", "message", …}}``.
No error carries a stack trace or request text.

On OpenAI's route (``OPENAI_PATHS``) every one of these bodies leaves in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, by :func:`openai_error` (its entry in
``ERROR_SHAPES``, applied by ``service/middleware/error_shape.py`` to whatever answered: a
middleware, a route or a handler): validation errors are 400 there (OpenAI's status for a bad request; its SDK raises ``BadRequestError``; an
unknown model 404, a question the model cannot be asked 422), the
queue's 529 is 503 (a status every HTTP client knows; the SDK retries it after Retry-After), the rest
keep their status, and headers (Retry-After, WWW-Authenticate) are kept.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from readers.errors import DecideError, EngineUnavailable, InvalidQuestion, PromptTooLong
from service.protocol import ErrorDetail, ErrorResponse


class UnknownDecision(DecideError):
    """Feedback for a decision id this service never recorded."""

    status_code = 404
    error_type = "unknown_decision"


class PermissionDenied(DecideError):
    """The caller's key lacks the scope a route needs (``service/scopes.py``'s ``require_scope``)."""

    status_code = 403
    error_type = "permission_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="Authorization")  # the key, not a body field, is what falls short


class RequestTooCostly(DecideError):
    """One request whose cost (the prompt tokens its reads compute: service/admission.py) exceeds what one
    request may take."""

    status_code = 413
    error_type = "request_too_large"


class TenantLimited(DecideError):
    """One tenant at a limit of its own: its share of admission (its queue, its expected wait, its
    tokens per minute: ``service/admission.py``) or its refits (``service/refit_limits.py``). 429, the
    caller's own limit, retried after Retry-After; other tenants are served meanwhile."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(DecideError):
    """The admission queue is full: Jev's 529, which its SDK retries after Retry-After."""

    status_code = 529
    error_type = "overloaded_error"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnsupportedFeature(DecideError):
    """A feature a client asked for that this server does not serve (Jev 1.14's Danger-Zone modes):
    refused by name rather than answered as if it had not been asked."""

    status_code = 400
    error_type = "unsupported_feature"


class DeadlineExceeded(DecideError):
    """The request ran past the server-side deadline (``decide serve --deadline``); its work was stopped."""

    status_code = 504
    error_type = "deadline_exceeded"


class NotUtf8(DecideError):
    """A body that is not UTF-8: JSON parsers guess UTF-16 and UTF-32 from the first bytes, but only
    UTF-8 is JSON between systems (RFC 8259), and the docs promise it."""

    status_code = 415
    error_type = "unsupported_media_type"


class ClientDisconnected(DecideError):
    """The client went away before its answer: nothing is sent, the outcome is logged as a disconnect."""

    status_code = 499
    error_type = "client_disconnected"


def validation_error(loc: tuple, message: str, error_type: str) -> RequestValidationError:
    """A 422 in the validation shape, for rules checked outside the wire models."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": error_type}])


def validation_response(error: RequestValidationError) -> JSONResponse:
    """The 422 body: ``loc``, ``msg``, ``type`` per error. ``input`` and ``ctx`` are dropped: they echo
    the request (state text, NaN that JSON cannot carry), and the message already names the rule."""
    items = [
        {"loc": [part if isinstance(part, int) else _printable(str(part)) for part in item.get("loc", ())],
         "msg": _printable(str(item.get("msg", ""))), "type": str(item.get("type", "value_error"))}
        for item in error.errors()
    ]  # fmt: skip
    # A field that takes one of several shapes (OpenAI's input: a string or a list of items) fails
    # once per shape; the shapes the value is not ("Input should be a valid string") say less than
    # the problem inside the shape it is, so that problem goes first: the SDKs' param and field
    # name the first. Stable: otherwise pydantic's order.
    items.sort(key=lambda item: item["type"] in _SHAPE_MISMATCHES)
    return JSONResponse({"detail": items}, status_code=422)


# Pydantic's error types for a value of another JSON type than a union member wants.
_SHAPE_MISMATCHES = frozenset(
    {"string_type", "list_type", "dict_type", "bool_type", "int_type", "float_type", "model_type",
     "model_attributes_type"}
)  # fmt: skip


def _printable(text: str) -> str:
    """Text safe to encode as UTF-8 JSON: lone surrogates become ``\\udXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, error_type: str, message: str, **fields: Any) -> dict[str, Any]:
    detail = ErrorDetail(error_type=error_type, message=message, **fields)
    return ErrorResponse(detail=detail).model_dump(mode="json", exclude_none=True)


def error_response(error: DecideError) -> JSONResponse:
    if isinstance(error, InvalidQuestion):
        # Same shape as schema errors: the field is in ``loc``.
        content = {"detail": [{"loc": list(error.loc), "msg": error.message, "type": error.error_type}]}
        return JSONResponse(content, status_code=error.status_code)
    fields: dict[str, Any] = {"param": error.param}
    headers = {}
    if isinstance(error, PromptTooLong):
        fields |= {
            "prompt_tokens": error.prompt_tokens,
            "context_length": error.context_length,
            "prompt_tokens_exact": error.exact_count,
        }
    if isinstance(error, (EngineUnavailable, Overloaded, TenantLimited)):
        headers["Retry-After"] = str(error.retry_after_s)
    body = error_body(error.status_code, error.error_type, error.message, **fields)
    return JSONResponse(body, status_code=error.status_code, headers=headers)


def internal_error_response(error: Exception) -> JSONResponse:
    """A JSON 500 naming only the exception's type: no message, trace or request text leaks."""
    body = error_body(500, "internal_error", f"internal error ({type(error).__name__})")
    return JSONResponse(body, status_code=500)


async def send_error(
    send, status: int, error_type: str, message: str, *, headers: dict[str, str] | None = None, **fields: Any
) -> None:
    """Answer an ASGI request with the error body, from a middleware (before any route runs)."""
    body = json.dumps(error_body(status, error_type, message, **fields), allow_nan=False).encode()
    extra = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()
    ]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def retry_after_s(seconds: float) -> int:
    """A Retry-After value: whole seconds, at least 1."""
    return max(1, math.ceil(seconds))


OPENAI_PATHS = frozenset({"/v1/decisions"})
"""Routes whose errors are in OpenAI's shape."""

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
# Pydantic puts a union member's tag or type in a field's path (questions.3.choice.choices); OpenAI's
# ``param`` names fields only (questions[3].choices).
_UNION_TAGS = frozenset(
    {"predicate", "choice", "score", "message", "function_call", "function_call_output", "custom_tool_call",
     "custom_tool_call_output", "input_text", "input_image", "input_json", "output_text", "refusal",
     "str", "bool", "int", "float", "dict", "list"}
)  # fmt: skip
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# The OpenAI route's questions become Jev's (service/pipeline/openai_decide.py), so a rule checked on
# the Jev question (admission's option tokens, the reader's labels) names Jev's field: ``criteria``
# is a choice's ``choices`` and a score's ``levels``, told apart by the question type before it. A
# loc with no type there comes from the reader, which refuses only options no labels can name: a
# choice's (a score's levels and a predicate's true/false are the service's own labels).
_OPENAI_CRITERIA = {"score": "levels"}


def openai_param(loc: list | tuple | str | None) -> str | None:
    """A Jev ``loc`` (or dotted ``param``) as OpenAI's ``param``: ``body.questions.3.choice.choices`` →
    ``questions[3].choices``, Jev's ``body.questions.3.choice.criteria.<option>`` → ``questions[3].choices``;
    None for the body as a whole."""
    if loc is None:
        return None
    parts = loc.split(".") if isinstance(loc, str) else list(loc)
    text, after_index, question_type = "", False, None
    for part in parts:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            text += f"[{part}]"
            after_index = True
            continue
        part = str(part)
        if part == "body" and not text:
            continue
        if after_index and part in _UNION_TAGS:
            question_type = part
            continue
        if part == "criteria":
            part = _OPENAI_CRITERIA.get(question_type, "choices")
            if part == "choices":
                # What follows is a Jev option name (a map key), not a field, and may look like an index.
                return f"{text}.{part}"
        if not _FIELD.match(part):
            continue
        text += f".{part}" if text else part
        after_index = False
    return text or None


def openai_error(
    status: int, body: Any, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """An error response's status and body on OpenAI's route, from the body this service would send
    elsewhere (any of the shapes above); the headers are kept as they are, so it needs none of them."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list) and detail:  # validation: 400, the first field named, every problem told
        first = detail[0]
        messages = "; ".join(
            f"{openai_param(item.get('loc')) or 'body'}: {str(item.get('msg', '')).removeprefix('Value error, ')}"
            for item in detail[:10]
        )
        code = str(first.get("type", "invalid_value"))
        # OpenAI's statuses: a model it does not serve is 404; a question that parsed but cannot be
        # asked of this model stays 422 (the SDK's UnprocessableEntityError); any other is 400.
        status, error_type, code = {
            "unknown_model": (404, "not_found_error", "model_not_found"),
            "invalid_question": (422, "invalid_request_error", code),
        }.get(code, (400, "invalid_request_error", code))
        error = {
            "message": messages,
            "type": error_type,
            "param": openai_param(first.get("loc")),
            "code": code,
        }
        return status, {"error": error}
    status = 503 if status == 529 else status
    if isinstance(detail, dict):
        message, code, param = (
            detail.get("message", ""),
            detail.get("error_type"),
            openai_param(detail.get("param")),
        )
    else:  # Starlette's own (404, 405): {"detail": "Not Found"}
        message, code, param = str(detail or "error"), None, None
    error_type = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return status, {"error": {"message": message, "type": error_type, "param": param, "code": code}}


GOOGLE_PREFIX = "/v1beta/"
"""Google's API version: every path under it (its decisions, its model list) answers in Google's shape."""

# Google's canonical codes (google.rpc.Code) by the HTTP status this service answers with. Its SDK
# raises by HTTP status (BadRequestError, NotFoundError, RateLimitError, InternalServerError, …) and
# retries 408, 409, 429 and 5xx, so what a retry cannot mend must leave as a 4xx other than those.
_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# Google's statuses for what this service answers otherwise: a body, prompt or request too large and
# a question the model cannot be asked are INVALID_ARGUMENT (400: no retry mends them); the admission
# queue's 529 is UNAVAILABLE (503, retried after Retry-After).
_GOOGLE_HTTP = {413: 400, 415: 400, 422: 400, 529: 503}
_RPC = "type.googleapis.com/google.rpc."


def google_field(loc: list | tuple | str | None) -> str | None:
    """A Jev ``loc`` (or dotted ``param``) as a Google field path: ``body.questions.q1.choice.criteria``
    → ``questions.q1.criteria``, ``body.input.2`` → ``input[2]``; None for the body as a whole."""
    if loc is None:
        return None
    parts = loc.split(".") if isinstance(loc, str) else list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    if len(parts) > 2 and parts[0] == "questions" and parts[2] in ("noul", "choice", "score"):
        del parts[2]  # the union's tag pydantic puts after the question id
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _FIELD.match(str(part)) and text.startswith("input"):
            continue  # pydantic's union member names (str, list[…], tagged-union[…])
        else:
            text += f".{part}" if text else str(part)
    return text or None


def google_error(
    status: int, body: Any, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """An error response's status and body on Google's paths (``{"error": {"code", "message",
    "status", "details"}}``), from the body this service would send elsewhere and its headers: a
    Retry-After is also told as ``google.rpc.RetryInfo``, where Google's clients look for it."""
    detail = body.get("detail") if isinstance(body, dict) else None
    details: list[dict[str, Any]] = []
    if isinstance(detail, list) and detail:  # validation: 400 naming every field, an unknown model 404
        reason = str(detail[0].get("type", "invalid_value"))
        violations = [
            {
                "field": google_field(item.get("loc")) or "body",
                "description": str(item.get("msg", "")).removeprefix("Value error, "),
            }
            for item in detail[:10]
        ]
        message = "; ".join(f"{v['field']}: {v['description']}" for v in violations)
        status = 404 if reason == "unknown_model" else 400
        details.append({"@type": _RPC + "BadRequest", "fieldViolations": violations})
    else:
        status = _GOOGLE_HTTP.get(status, status)
        if isinstance(detail, dict):
            message, reason = str(detail.get("message", "")), detail.get("error_type")
            field = google_field(detail.get("param"))
            if field is not None and status == 400:  # a field of the request (not a header, a limit)
                details.append(
                    {
                        "@type": _RPC + "BadRequest",
                        "fieldViolations": [{"field": field, "description": message}],
                    }
                )
        else:  # Starlette's own (404, 405): {"detail": "Not Found"}
            message, reason = str(detail or "error"), None
    if reason is not None:
        details.insert(0, {"@type": _RPC + "ErrorInfo", "reason": str(reason), "domain": "opendecide"})
    retry_after = {name.lower(): value for name, value in (headers or {}).items()}.get("retry-after", "")
    if retry_after.isdigit():
        details.append({"@type": _RPC + "RetryInfo", "retryDelay": f"{int(retry_after)}s"})
    canonical = _GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    return status, {"error": {"code": status, "message": message, "status": canonical, "details": details}}


ErrorShape = Callable[[int, Any, Mapping[str, str]], tuple[int, dict[str, Any]]]
"""How a wire format renders an error: (status, the body this service sends elsewhere, its headers)
→ (status, the format's body). The one hook a wire format whose errors look otherwise adds, once,
below; the response keeps its headers (Retry-After, WWW-Authenticate) whatever the shape."""

ERROR_SHAPES: dict[str, ErrorShape] = dict.fromkeys(OPENAI_PATHS, openai_error) | {
    GOOGLE_PREFIX: google_error
}
"""Path → the error shape of the wire format that path speaks; a key ending in ``/`` covers every
path under it (Google's ``/v1beta/``, whose model names are in its paths). Paths not here answer in
this service's own shape. Applied to whatever answered (``service/middleware/error_shape.py``) and
to the app's last-resort 500 (``service/app.py``), each through :func:`error_shape`."""


def error_shape(shapes: Mapping[str, ErrorShape], path: str) -> ErrorShape | None:
    """The shape ``path`` answers in: its own entry, else that of the longest prefix entry above it."""
    shape = shapes.get(path)
    if shape is not None:
        return shape
    prefixes = [key for key in shapes if key.endswith("/") and path.startswith(key)]
    return shapes[max(prefixes, key=len)] if prefixes else None
