"""Google's Decisions API over the same pipeline as ``/v1/systemone``: ``POST /v1beta/decisions``, and
``GET /v1beta/models`` and ``GET /v1beta/models/{name}`` for its SDK's ``client.models``.

The body is parsed and checked as Jev's is (``service/parse.py``), translated onto Jev's questions
(``service/pipeline/google_decide.py``), and answered by the same decision path
(``service/decision_route.py``: scopes, admission by cost, cancellation, metrics). Every answer under
``/v1beta/`` that is an error leaves in Google's shape (``service/errors.py:google_error``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.decision_route import Asked, serve_decisions
from service.errors import validation_error
from service.openapi import body_schema, error_responses
from service.pipeline.google_decide import to_google_response, to_systemone
from service.pipeline.transcript import TranscriptError
from service.protocol.google_answers import (
    GoogleDecisionResponse,
    GoogleErrorResponse,
    GoogleModel,
    GoogleModelList,
)
from service.protocol.google_decisions import MODEL_PREFIX, GoogleDecisionRequest
from service.protocol.models import GOOGLE_ALIASES, JEV_ALIASES
from service.state import reader_of

router = APIRouter()


def google_errors(*codes: int) -> dict[int | str, dict]:
    """The statuses a /v1beta/ route answers with, each in Google's shape."""
    described = error_responses(*(code for code in codes if code != 404))
    return {code: {**spec, "model": GoogleErrorResponse} for code, spec in described.items()} | (
        {404: {"model": GoogleErrorResponse, "description": "NOT_FOUND: a model this server does not serve"}}
        if 404 in codes
        else {}
    )


# Google's statuses (service/errors.py:google_error): a bad body, a question the model cannot be
# asked, a body, prompt or request over its limit are all 400 INVALID_ARGUMENT; the admission
# queue's 529 is 503 UNAVAILABLE.
GOOGLE_ERRORS = google_errors(401, 403, 404, 408, 429, 502, 503, 504) | {
    400: {
        "model": GoogleErrorResponse,
        "description": "INVALID_ARGUMENT: the body, a field, a non-text part, or a body, prompt or request "
        "over its limit; details name the fields (google.rpc.BadRequest) and the reason (google.rpc.ErrorInfo)",
    },
}


def asked(body: GoogleDecisionRequest, scope_state: dict) -> Asked:
    try:
        return Asked(to_systemone(body))
    except TranscriptError as error:
        raise validation_error(error.loc, error.message, error.code) from None


async def create_decision(request: Request) -> JSONResponse:
    return await serve_decisions(
        request, GoogleDecisionRequest, asked, to_google_response, aliases=(*JEV_ALIASES, *GOOGLE_ALIASES)
    )


router.add_api_route(
    "/v1beta/decisions",
    create_decision,
    methods=["POST"],
    response_model=GoogleDecisionResponse,
    openapi_extra=body_schema(GoogleDecisionRequest),
    responses=GOOGLE_ERRORS,
)


def served_models(request: Request) -> list[GoogleModel]:
    """The served model, then every alias the decisions route takes, as ``models/{name}``."""
    served = reader_of(request).engine.info
    return [
        GoogleModel(
            name=f"{MODEL_PREFIX}{name}",
            base_model_id=served.name,
            version=served.revision,
            display_name=served.name,
            description=served.description,
            input_token_limit=served.context_length,
            output_token_limit=1,
            supported_generation_methods=["createDecision"],
        )
        for name in (served.name, *JEV_ALIASES, *GOOGLE_ALIASES)
    ]


@router.get("/v1beta/models", response_model=GoogleModelList, responses=google_errors(401, 503))
async def list_models(request: Request) -> GoogleModelList:
    return GoogleModelList(models=served_models(request))


@router.get("/v1beta/models/{name:path}", response_model=GoogleModel, responses=google_errors(401, 404, 503))
async def get_model(name: str, request: Request) -> GoogleModel:
    for model in served_models(request):
        if model.name == f"{MODEL_PREFIX}{name.removeprefix(MODEL_PREFIX)}":
            return model
    raise validation_error(("path", "name"), f"model {name!r} is not served here", "unknown_model")
