"""``POST /v1/decisions``: OpenAI's Decisions API over the same pipeline as ``/v1/systemone``.

The body is parsed and checked as Jev's is (``service/parse.py``: NaN, lone surrogates and duplicate
keys refused), translated onto Jev's questions (``service/pipeline/openai_decide.py``), and answered
by the same decision path (``service/decision_route.py``: admission by cost, cancellation, metrics).
Errors leave this route in OpenAI's shape (``service/middleware/error_shape.py``).

``prompt_cache_key`` is the fleet router's affinity key for the request's reads (readers/engines/
routing.py); ``safety_identifier`` goes to the access log as an id (ascii, cut short), nothing else.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.decision_route import Asked, serve_decisions
from service.errors import validation_error
from service.openapi import body_schema, error_responses
from service.pipeline.openai_decide import to_decision_response, to_systemone
from service.pipeline.transcript import TranscriptError
from service.protocol.models import JEV_ALIASES, OPENAI_ALIASES
from service.protocol.openai_answers import DecisionResponse, OpenAIErrorResponse
from service.protocol.openai_decisions import DecisionRequest

router = APIRouter()

# Every error here is in OpenAI's shape (service/middleware/error_shape.py): validation is 400,
# an unknown model 404, the admission queue's 529 a 503; a key without the decide scope 403
# permission_error.
OPENAI_ERRORS = {
    code: {**spec, "model": OpenAIErrorResponse}
    for code, spec in error_responses(400, 401, 403, 408, 413, 415, 422, 429, 502, 503, 504).items()
} | {
    400: {"model": OpenAIErrorResponse, "description": "the body or a field is invalid: param names it"},
    404: {"model": OpenAIErrorResponse, "description": "model_not_found: a model this server does not serve"},
    422: {
        "model": OpenAIErrorResponse,
        "description": "a question that parsed but cannot be asked of this model",
    },
    503: {
        "model": OpenAIErrorResponse,
        "description": "the engine is not ready, or the admission queue is full; Retry-After",
    },
    504: {
        "model": OpenAIErrorResponse,
        "description": "the engine did not answer in time, or the request ran past the server's deadline (deadline_exceeded)",
    },
}

MAX_LOGGED_ID = 64


def asked(body: DecisionRequest, scope_state: dict) -> Asked:
    """OpenAI's body as Jev's request, read with the caller's ``prompt_cache_key`` as routing key."""
    try:
        jev = to_systemone(body)
    except TranscriptError as error:
        raise validation_error(error.loc, error.message, error.code) from None
    if body.safety_identifier is not None:
        # An opaque end-user id, logged so abuse can be traced to it; never the key, never request text.
        scope_state["safety_identifier"] = ascii(body.safety_identifier[:MAX_LOGGED_ID])[1:-1]
    return Asked(jev, affinity_key=body.prompt_cache_key)


async def create_decision(request: Request) -> JSONResponse:
    return await serve_decisions(
        request, DecisionRequest, asked, to_decision_response, aliases=(*JEV_ALIASES, *OPENAI_ALIASES)
    )


router.add_api_route(
    "/v1/decisions",
    create_decision,
    methods=["POST"],
    response_model=DecisionResponse,
    openapi_extra=body_schema(DecisionRequest),
    responses=OPENAI_ERRORS,
)
