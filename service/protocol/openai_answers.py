"""OpenAI's ``POST /v1/decisions`` response and error body, as the ``openai`` SDK 3.51.0 types them.

Read from ``openai/types/decision.py``; fields keep their order. Our extensions sit below the
``# -- opendecide extensions`` markers: per answer ``x_reading``, per response ``x_provenance``; the
SDK keeps unknown response fields and ignores them. The request is ``openai_decisions.py``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from service.protocol.answers import Provenance, ReadingOut
from service.protocol.base import ResponseModel


class DecisionPredicateAnswer(ResponseModel):
    name: str | None = None
    probability: float
    type: Literal["predicate"] = "predicate"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class ChoiceProbability(ResponseModel):
    probability: float
    value: str | bool


class DecisionChoiceAnswer(ResponseModel):
    choice: str | bool
    confidence: float
    name: str | None = None
    probabilities: list[ChoiceProbability]
    type: Literal["choice"] = "choice"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class ScoreProbability(ResponseModel):
    label: str
    probability: float
    value: int


class DecisionScoreAnswer(ResponseModel):
    confidence: float
    name: str | None = None
    probabilities: list[ScoreProbability]
    score: float
    type: Literal["score"] = "score"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class DecisionRefusal(ResponseModel):
    """This service abstained: no label came back, or confidence was under ``x_min_confidence``.
    ``x_reading`` says which (``informative``) and what was read."""

    name: str | None = None
    type: Literal["refusal"] = "refusal"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


DecisionAnswer = Annotated[
    DecisionPredicateAnswer | DecisionChoiceAnswer | DecisionScoreAnswer | DecisionRefusal,
    Field(discriminator="type"),
]


class InputTokensDetails(ResponseModel):
    cache_write_tokens: int = Field(description="0: this service keeps no cache it bills writes to")
    cached_tokens: int = Field(
        description="input tokens the engine did not compute (prefix cache, or shared with another question of the request)"
    )


class OutputTokensDetails(ResponseModel):
    reasoning_tokens: int = Field(description="0: nothing is generated, one answer slot is read per question")


class DecisionUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class DecisionProvenance(Provenance):
    input_rendering: str = Field(description="the version of the input's rendering into the state read")


class DecisionResponse(ResponseModel):
    answers: list[DecisionAnswer]
    model: str
    usage: DecisionUsage
    # -- opendecide extensions
    provenance: DecisionProvenance = Field(serialization_alias="x_provenance")


class OpenAIErrorDetail(ResponseModel):
    message: str
    type: str = Field(
        description="invalid_request_error, authentication_error, rate_limit_error, server_error"
    )
    param: str | None = Field(description="the field or header the error is about, e.g. questions[3].choices")
    code: str | None = Field(description="this service's error type (the Jev route's error_type)")


class OpenAIErrorResponse(ResponseModel):
    """Every error on ``/v1/decisions``, in OpenAI's shape."""

    error: OpenAIErrorDetail
