"""Errors of the service itself, and how every ``DecideError`` becomes an HTTP response.

    DecideError (readers/errors.py)
    └── UnknownDecision (404)   feedback for a decision id that was never recorded

Validation errors keep FastAPI's (and Jev's) ``{"detail": [{"loc", "msg", "type"}]}`` shape; every
other error is ``{"detail": {"message", "type", "param", …}}``.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from readers.errors import DecideError, EngineUnavailable, InvalidQuestion, PromptTooLong
from service.protocol import ErrorDetail, ErrorResponse


class UnknownDecision(DecideError):
    """Feedback for a decision id this service never recorded."""

    status_code = 404
    error_type = "unknown_decision"


def validation_error(loc: tuple, message: str, error_type: str, value: Any = None) -> RequestValidationError:
    """A 422 in the validation shape, for rules checked outside the wire models."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": error_type, "input": value}])


def error_response(error: DecideError) -> JSONResponse:
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


def internal_error_response(error: Exception) -> JSONResponse:
    """A JSON 500 naming only the exception's type: no message, trace or request text leaks."""
    detail = ErrorDetail(message=f"internal error ({type(error).__name__})", type="internal_error")
    return JSONResponse(ErrorResponse(detail=detail).model_dump(mode="json", exclude_none=True), status_code=500)
