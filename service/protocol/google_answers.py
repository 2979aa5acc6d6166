"""Google's ``POST /v1beta/decisions`` response, its error body and ``GET /v1beta/models``, as the
``google-genai`` SDK 3.3.0 reads them.

Read from ``google/genai/_gaos/types/decisions/`` (``createdecisionresponse.py``, ``noulanswer.py``,
``choiceanswer.py``, ``scoreanswer.py``, ``promptfeedback.py``), the usage in
``_gaos/types/interactions/usage.py`` and the model list in ``google/genai/models.py``
(``_Model_from_mldev``). Our extensions sit below the ``# -- opendecide extensions`` markers; the SDK
keeps unknown fields and ignores them. The request is ``google_decisions.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from service.protocol.answers import Provenance, ReadingOut
from service.protocol.base import ResponseModel

CONFIDENCE = "the probability of the winning outcome: max(noul, 1 − noul), or the top probability"


class GoogleNoulAnswer(ResponseModel):
    confidence: float = Field(description=CONFIDENCE)
    noul: float = Field(description="P(true), as on the other routes (not clipped to [0.01, 0.99])")
    type: Literal["noul"] = "noul"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class GoogleChoiceAnswer(ResponseModel):
    choice: str
    confidence: float = Field(description=CONFIDENCE)
    probabilities: dict[str, float]
    type: Literal["choice"] = "choice"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class GoogleScoreAnswer(ResponseModel):
    confidence: float = Field(description=CONFIDENCE)
    legend: dict[str, str] = Field(description="each level's index → its text, as asked")
    probabilities: dict[str, float] = Field(description="each level's index → its probability")
    score: float = Field(description="the expected level, Σ k·p_k")
    type: Literal["score"] = "score"
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


GoogleAnswer = Annotated[
    GoogleNoulAnswer | GoogleChoiceAnswer | GoogleScoreAnswer, Field(discriminator="type")
]


class ModalityTokens(ResponseModel):
    modality: Literal["text"] = "text"
    tokens: int


class GoogleUsage(ResponseModel):
    """The SDK's ``Usage``, from the readings' own counts (as the OpenAI route's usage)."""

    input_tokens_by_modality: list[ModalityTokens]
    total_cached_tokens: int = Field(
        description="input tokens the engine did not compute (prefix cache, or shared with another question of the request)"
    )
    total_input_tokens: int
    total_output_tokens: int = Field(description="one answer slot read per question")
    total_thought_tokens: int = Field(description="0: nothing is generated")
    total_tokens: int


class GoogleDecisionResponse(ResponseModel):
    """``prompt_feedback`` is never sent: this service blocks no input for its content."""

    answers: dict[str, GoogleAnswer]
    usage: GoogleUsage
    # -- opendecide extensions
    provenance: Provenance = Field(serialization_alias="x_provenance")


class GoogleErrorStatus(ResponseModel):
    code: int = Field(description="the HTTP status")
    message: str
    status: str = Field(
        description="INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, RESOURCE_EXHAUSTED, "
        "DEADLINE_EXCEEDED, UNAVAILABLE, INTERNAL"
    )
    details: list[dict[str, Any]] = Field(
        description="google.rpc.ErrorInfo (reason: this service's error type), google.rpc.BadRequest "
        "(the fields), google.rpc.RetryInfo (with Retry-After)"
    )


class GoogleErrorResponse(ResponseModel):
    """Every error on ``/v1beta/…``, in Google's shape."""

    error: GoogleErrorStatus


class GoogleModel(ResponseModel):
    """One name in Google's list: ``models/{name}``, the served model or one of its aliases."""

    name: str
    base_model_id: str = Field(serialization_alias="baseModelId")
    version: str = Field(description="the served model's revision")
    display_name: str = Field(serialization_alias="displayName")
    description: str
    input_token_limit: int = Field(serialization_alias="inputTokenLimit")
    output_token_limit: int = Field(serialization_alias="outputTokenLimit", description="1: one answer slot")
    supported_generation_methods: list[str] = Field(serialization_alias="supportedGenerationMethods")


class GoogleModelList(ResponseModel):
    models: list[GoogleModel]
