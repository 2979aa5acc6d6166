"""``GET /v1/models``: the served model in Jev's shape, with what the engine can do."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.openapi import error_responses
from service.protocol import ModelCard, ModelList
from service.state import JEV_ALIASES, reader_of

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503))
async def list_models(request: Request) -> ModelList:
    served = reader_of(request).engine
    card = ModelCard(
        name=served.info.name,
        description=served.info.description,
        release_date=served.info.release_date,
        revision=served.info.revision,
        engine=served.kind,
        read_mode=served.capabilities.read_mode.value,
        max_logprobs=served.capabilities.max_logprobs,
        top_k=served.capabilities.top_k,
        context_length=served.info.context_length,
        aliases=list(JEV_ALIASES),
    )
    return ModelList(models=[card])
