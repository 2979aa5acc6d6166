"""Google's ``POST /v1beta/decisions`` request, as the ``google-genai`` SDK 3.3.0 types it.

Read from ``google/genai/_gaos/types/decisions/`` (``createdecisionrequest.py``, ``question.py``,
``noulquestion.py``, ``choicequestion.py``, ``scorequestion.py``, ``noulcriteria.py``) and the
content parts in ``_gaos/types/interactions/``; fields keep their order. The response, the error
body and the model list are ``google_answers.py``.

The request translates onto Jev's question objects (``service/pipeline/google_decide.py``): the
caller's question ids are Jev's question names, and the text parts of ``input`` are the state.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from service.protocol.base import BodyModel, RequestModel
from service.protocol.questions import (
    MAX_LEVELS,
    MAX_OPTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
    check_question_names,
)

# Google documents 1–1,000 questions, and 2–255 options or levels, per request. Scores are read by
# their digits here (readers/prompt.py: levels 0 … 9), so a score takes MAX_LEVELS levels at most.
GOOGLE_MAX_QUESTIONS = 1000
GOOGLE_MAX_LEVELS = 255
MODEL_PREFIX = "models/"


# -- content parts -------------------------------------------------------------------------------


class TextPart(RequestModel):
    text: str
    annotations: list[dict[str, Any]] | None = None  # citations on model output: accepted, not read
    type: Literal["text"]


class MediaPart(RequestModel):
    """Image, audio, video and document parts. An image with inline ``data`` (base64) and its
    ``mime_type`` is read where the served model reads images (``image_parts.py``); one by ``uri``
    is refused, never fetched. Audio, video and documents are refused by name and index. Their other
    fields are not checked."""

    model_config = ConfigDict(extra="allow")

    type: Literal["image", "audio", "video", "document"]


InputPart = Annotated[TextPart | MediaPart, Field(discriminator="type")]
Instructions = str | TextPart | list[TextPart]


def parts_text(parts: str | TextPart | list[Any]) -> str:
    """Text parts in order, one per line (as the OpenAI route joins its instruction parts); an image
    part reads ``[image]`` where it stands (the image itself is read before the text)."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, TextPart):
        return parts.text
    return "\n".join(part.text if isinstance(part, TextPart) else "[image]" for part in parts)


# -- questions -----------------------------------------------------------------------------------


class _Question(RequestModel):
    @field_validator("instructions", check_fields=False)
    @classmethod
    def check_instructions(cls, instructions: Instructions) -> Instructions:
        if isinstance(instructions, list) and not instructions:
            raise ValueError("instructions need at least one text part")
        return instructions


class NoulCriteria(RequestModel):
    false_description: str | None = None
    true_description: str | None = None


class GoogleNoulQuestion(_Question):
    """True or false: Jev's ``noul``, each outcome's description its criterion."""

    instructions: Instructions
    criteria: NoulCriteria | None = None
    type: Literal["noul"]

    def to_jev(self) -> NoulQuestion:
        criteria = self.criteria or NoulCriteria()
        return NoulQuestion.model_validate(
            {
                "type": "noul",
                "instructions": parts_text(self.instructions),
                "criteria": {"true": criteria.true_description, "false": criteria.false_description},
            }
        )


class GoogleChoiceQuestion(_Question):
    """Option id → description (empty: none); Jev's ``choice`` with the same names."""

    criteria: dict[str, str] = Field(
        json_schema_extra={"minProperties": MIN_OPTIONS, "maxProperties": MAX_OPTIONS}
    )
    instructions: Instructions
    type: Literal["choice"]

    @field_validator("criteria")
    @classmethod
    def check_option_ids(cls, criteria: dict[str, str]) -> dict[str, str]:
        # Google's rule for option ids; the count, duplicates (as Jev compares names) and lengths are
        # Jev's question's own checks, applied in to_jev.
        for name in criteria:
            if not name or name != name.strip():
                raise ValueError(f"option id {name[:40]!r} is empty or has leading or trailing whitespace")
            if any(unicodedata.category(char) == "Cc" for char in name):
                raise ValueError(f"option id {name[:40]!r} has a control character")
        return criteria

    def to_jev(self) -> ChoiceQuestion:
        return ChoiceQuestion.model_validate(
            {
                "type": "choice",
                "instructions": parts_text(self.instructions),
                "criteria": {name: description or None for name, description in self.criteria.items()},
            }
        )


class GoogleScoreQuestion(_Question):
    """Levels counted from 0, each one's rubric text; Jev's ``score`` with the same criteria."""

    criteria: list[str] = Field(json_schema_extra={"minItems": MIN_LEVELS, "maxItems": MAX_LEVELS})
    instructions: Instructions
    type: Literal["score"]

    @field_validator("criteria")
    @classmethod
    def check_levels(cls, criteria: list[str]) -> list[str]:
        if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
            raise ValueError(
                f"a score needs {MIN_LEVELS} to {MAX_LEVELS} levels on this server (levels are read as the "
                f"digits 0-{MAX_LEVELS - 1}; Google's API allows up to {GOOGLE_MAX_LEVELS}), got {len(criteria)}"
            )
        for index, level in enumerate(criteria):
            if not level.strip():
                raise ValueError(f"criteria[{index}]: a level must not be empty")
        return criteria

    def to_jev(self) -> ScoreQuestion:
        return ScoreQuestion.model_validate(
            {"type": "score", "instructions": parts_text(self.instructions), "criteria": list(self.criteria)}
        )


GoogleQuestion = Annotated[
    GoogleNoulQuestion | GoogleChoiceQuestion | GoogleScoreQuestion, Field(discriminator="type")
]


class GoogleDecisionRequest(BodyModel):
    """``POST /v1beta/decisions``: the SDK's ``CreateDecisionRequest``."""

    input: str | InputPart | list[InputPart]
    model: str = Field(description="models/{model}: the served model or one of its aliases")
    questions: dict[str, GoogleQuestion] = Field(
        json_schema_extra={"minProperties": 1, "maxProperties": GOOGLE_MAX_QUESTIONS}
    )

    @field_validator("model")
    @classmethod
    def strip_model_prefix(cls, model: str) -> str:
        # The model is compared by its bare name (service/parse.py:parse_for_model); the SDK's
        # documented form is models/{model}, and a bare name is taken as Gemini's other methods take it.
        return model.removeprefix(MODEL_PREFIX)

    @field_validator("questions")
    @classmethod
    def check_questions(cls, questions: dict) -> dict:
        if not 1 <= len(questions) <= GOOGLE_MAX_QUESTIONS:
            raise ValueError(f"a request asks 1 to {GOOGLE_MAX_QUESTIONS} questions, got {len(questions)}")
        check_question_names(questions)
        return questions

    def input_parts(self) -> list[TextPart | MediaPart]:
        if isinstance(self.input, str):
            return [TextPart(text=self.input, type="text")]
        return self.input if isinstance(self.input, list) else [self.input]

    def media_part(self) -> tuple[tuple[str | int, ...], str] | None:
        """Where the first part of ``input`` that is neither text nor an image is (a path under the
        body) and its type, or None."""
        for where, part in self._located_parts():
            if isinstance(part, MediaPart) and part.type != "image":
                return where, part.type
        return None

    def image_parts(self) -> list[tuple[tuple[str | int, ...], MediaPart]]:
        """Every image part of ``input``, in order, with its path under the body."""
        return [
            (where, part)
            for where, part in self._located_parts()
            if isinstance(part, MediaPart) and part.type == "image"
        ]

    def _located_parts(self) -> list[tuple[tuple[str | int, ...], TextPart | MediaPart]]:
        if isinstance(self.input, list):
            return [(("input", index), part) for index, part in enumerate(self.input)]
        if isinstance(self.input, (TextPart, MediaPart)):
            return [(("input",), self.input)]
        return []
