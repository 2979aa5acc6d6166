"""Errors a decision can end in, each with the HTTP status the service answers with.

    DecideError (500)
    ├── InvalidQuestion (422)      a question the reader cannot ask (labels it cannot cover, …)
    ├── PromptTooLong (413)        state + question exceed the model's context; never truncated
    └── EngineError (502)
        ├── EngineUnavailable (503)  engine unreachable or not ready; carries Retry-After
        ├── EngineTimeout (504)      engine did not answer in time
        └── EngineBadReply (502)     engine answered without usable log-probs

The service adds its own errors (``service/errors.py``). Request-shape errors (unknown fields, wrong
types, duplicate options, …) are pydantic validation errors raised by the wire models and never reach
this tree.
"""

from __future__ import annotations

# Where a bad value sits in the request body, as a 422 names it: ("body", "questions", name, …).
Loc = tuple[str | int, ...]


class DecideError(Exception):
    """Base of every error a decision can end in."""

    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidQuestion(DecideError):
    """A question that passed schema validation but cannot be asked of this model."""

    status_code = 422
    error_type = "invalid_question"

    def __init__(self, message: str, *, loc: Loc) -> None:
        super().__init__(message, param=".".join(str(part) for part in loc) or None)
        self.loc = loc


class PromptTooLong(DecideError):
    """The prompt does not fit the model's context window."""

    status_code = 413
    error_type = "prompt_too_long"

    def __init__(
        self,
        message: str,
        *,
        prompt_tokens: int,
        context_length: int,
        param: str | None = None,
        exact_count: bool = True,
    ) -> None:
        super().__init__(message, param=param)
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        self.exact_count = exact_count  # False: prompt_tokens is a lower bound, found without tokenizing


class EngineError(DecideError):
    """The engine failed to produce a usable read."""

    status_code = 502
    error_type = "engine_error"


class EngineUnavailable(EngineError):
    status_code = 503
    error_type = "engine_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineTimeout(EngineError):
    status_code = 504
    error_type = "engine_timeout"


class EngineBadReply(EngineError):
    status_code = 502
    error_type = "engine_bad_reply"
