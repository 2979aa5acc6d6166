"""``GET /v1/models``: the served model in Jev's shape (with what the engine can do) and in OpenAI's."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Request

from service.openapi import error_responses
from service.protocol import ModelCard, ModelList
from service.protocol.models import OPENAI_ALIASES, OpenAIModel
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
        reads_images=served.capabilities.images,
    )
    created = _unix_seconds(served.info.release_date)
    names = (served.info.name, *JEV_ALIASES, *OPENAI_ALIASES)
    return ModelList(
        models=[card], data=[OpenAIModel(id=name, created=created, owned_by="opendecide") for name in names]
    )


def _unix_seconds(date: str) -> int:
    """A YYYY-MM-DD release date as OpenAI's ``created``; 0 where the model's manifest gives none."""
    try:
        return int(dt.datetime.fromisoformat(date).replace(tzinfo=dt.UTC).timestamp())
    except ValueError:
        return 0
