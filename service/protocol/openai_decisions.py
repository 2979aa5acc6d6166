"""OpenAI's ``POST /v1/decisions`` request, as the ``openai`` SDK 3.51.0 types it.

Read from ``openai/types/decision_create_params.py``; fields keep their order. Our extensions sit
below the ``# -- opendecide extensions`` markers: per question the same read options as Jev's
questions (``x_debias``, ``x_rotations``, ``x_min_confidence``). The response and the error body
(``openai/types/decision.py``) are ``openai_answers.py``.

The request translates onto Jev's question objects (:meth:`DecisionRequest.to_systemone_questions`),
so both routes read through one pipeline; the state is the input rendered by
``service/pipeline/transcript.py``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from readers.prompt import content_text
from service.protocol.base import MAX_ID_CHARS, BodyModel, RequestModel
from service.protocol.questions import (
    MAX_LEVELS,
    MAX_OPTION_NAME_CHARS,
    MAX_OPTIONS,
    MAX_QUESTION_NAME_CHARS,
    MAX_QUESTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    ChoiceQuestion,
    Debias,
    MinConfidence,
    NoulQuestion,
    Rotations,
    ScoreQuestion,
    first_duplicate,
    option_identity,
)

# -- input parts ---------------------------------------------------------------------------------


class CacheBreakpoint(RequestModel):
    """Accepted and not acted on: this service's prefix reuse is automatic (docs/openai-decisions.md)."""

    mode: Literal["explicit"]


class InputText(RequestModel):
    text: str
    type: Literal["input_text"]
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputImage(RequestModel):
    """An image of the input, as a ``data:`` URL (``service/protocol/image_parts.py``; any other URL
    is refused, never fetched), read where the served model reads images. ``detail`` is accepted and
    not used: the served model's processor sizes the image. An image in a question's instructions is
    refused: a request's images are its state, which all its questions share."""

    image_url: str
    type: Literal["input_image"]
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputJson(RequestModel):
    data: dict[str, Any] | list[dict[str, Any]]
    type: Literal["input_json"]


class OutputText(RequestModel):
    text: str
    type: Literal["output_text"]


class RefusalPart(RequestModel):
    refusal: str
    type: Literal["refusal"]


Part = Annotated[InputText | InputImage | InputJson | OutputText | RefusalPart, Field(discriminator="type")]
QuestionPart = Annotated[InputText | InputImage | InputJson, Field(discriminator="type")]

# Which parts each role may send, as the SDK's types allow them.
ROLE_PARTS: dict[str, frozenset[str]] = {
    "user": frozenset({"input_text", "input_image", "input_json"}),
    "developer": frozenset({"input_text"}),
    "system": frozenset({"input_text"}),
    "assistant": frozenset({"output_text", "refusal"}),
}


# -- input items ---------------------------------------------------------------------------------


class Message(RequestModel):
    content: str | list[Part]
    role: Literal["user", "developer", "system", "assistant"]
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = None

    @model_validator(mode="after")
    def check_parts_fit_role(self) -> Message:
        if self.phase is not None and self.role != "assistant":
            raise ValueError("phase is for assistant messages only")
        if isinstance(self.content, list):
            allowed = ROLE_PARTS[self.role]
            for index, part in enumerate(self.content):
                if part.type not in allowed:
                    raise ValueError(
                        f"content[{index}]: a {self.role} message takes {', '.join(sorted(allowed))} parts, not {part.type}"
                    )
        return self


Status = Literal["in_progress", "completed", "incomplete"]
ToolOutput = str | list[Annotated[InputText | InputImage, Field(discriminator="type")]]


# A tool's name and a call's id are written into the transcript's bracketed headers
# (``[tool call NAME, CALL_ID]``, service/pipeline/transcript.py): a name with a newline, bracket or
# comma could close its header and open a forged ``[system]`` turn, so both are held to characters
# that cannot. Names: OpenAI's function-name characters plus "." and ":" (namespaced tools).
TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
CALL_ID = re.compile(r"[^\s\[\],\x00-\x1f\x7f]+")


class _ToolItem(RequestModel):
    """What a tool call and a tool output share; each kind adds its ``type`` and its text."""

    call_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    status: Status | None = None

    @field_validator("call_id")
    @classmethod
    def check_call_id(cls, call_id: str) -> str:
        if not CALL_ID.fullmatch(call_id):
            raise ValueError(
                "a call_id must not hold whitespace, control characters, brackets or commas "
                "(it is written into the transcript's turn headers)"
            )
        return call_id


class _ToolCall(_ToolItem):
    """A call names its tool; the name is written into the transcript's turn headers."""

    name: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def check_name(cls, name: str) -> str:
        if not TOOL_NAME.fullmatch(name):
            raise ValueError(
                "a tool name is 1 to 128 letters (A-Z, a-z), digits, '_', '.', ':' or '-' "
                "(it is written into the transcript's turn headers)"
            )
        return name


class FunctionCall(_ToolCall):
    arguments: str
    type: Literal["function_call"]


class FunctionCallOutput(_ToolItem):
    output: ToolOutput
    type: Literal["function_call_output"]


class CustomToolCall(_ToolCall):
    input: str
    type: Literal["custom_tool_call"]


class CustomToolCallOutput(_ToolItem):
    output: ToolOutput
    type: Literal["custom_tool_call_output"]


def _item_kind(item: Any) -> str:
    # A message may omit ``type`` (the SDK marks it optional): it is a message then.
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", "message")


InputItem = Annotated[
    Annotated[Message, Tag("message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[CustomToolCall, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutput, Tag("custom_tool_call_output")],
    Discriminator(_item_kind),
]


# -- questions -----------------------------------------------------------------------------------


Instructions = str | list[QuestionPart]


class _Question(RequestModel):
    # OpenAI's ``name`` is optional and need not be unique (answers are a list), but where it is given
    # it is bounded as a Jev question name is: it is echoed on the answer and logged.
    @field_validator("name", check_fields=False)
    @classmethod
    def check_name(cls, name: str | None) -> str | None:
        if name is None:
            return None
        if not name.strip():
            raise ValueError("a question's name must not be empty (leave it out instead)")
        if len(name) > MAX_QUESTION_NAME_CHARS:
            raise ValueError(
                f"a question's name has {len(name)} characters; at most {MAX_QUESTION_NAME_CHARS}"
            )
        return name

    def instructions_text(self) -> str:
        """The instructions as one text: parts in order, JSON as compact JSON (Jev's rendering)."""
        instructions = self.instructions  # type: ignore[attr-defined]
        if isinstance(instructions, str):
            return instructions
        texts = []
        for part in instructions:
            if isinstance(part, InputImage):  # refused by name before translation (images_in)
                raise AssertionError("an instructions input_image reached the translation")
            texts.append(part.text if isinstance(part, InputText) else content_text(part.data))
        return "\n".join(texts)

    def read_options(self) -> dict[str, Any]:
        return {
            "x_debias": self.debias,
            "x_rotations": self.rotations,
            "x_min_confidence": self.min_confidence,
        }  # type: ignore[attr-defined]


class DecisionPredicateQuestion(_Question):
    """How likely a statement about the input is true: Jev's ``noul``."""

    instructions: Instructions
    type: Literal["predicate"]
    name: str | None = None
    # -- opendecide extensions
    debias: Debias = None
    rotations: Rotations = None
    min_confidence: MinConfidence = None

    def to_jev(self) -> NoulQuestion:
        return NoulQuestion.model_validate(
            {"type": "noul", "instructions": self.instructions_text(), **self.read_options()}
        )


class Choice(RequestModel):
    # Strict: a boolean must stay a boolean, the string "true" a string (typed values are distinct).
    value: Annotated[str, Field(strict=True)] | Annotated[bool, Field(strict=True)]
    description: str | None = None


def option_names(choices: list[Choice]) -> list[str]:
    """The names the model reads: a string as written, a boolean as ``true``/``false``; a string
    that is exactly a boolean choice's text (``"true"`` beside ``true``) is quoted, so the two
    distinct values (OpenAI: "a string and a boolean with the same text are distinct") read as two
    options."""
    booleans = {"true" if c.value else "false" for c in choices if isinstance(c.value, bool)}
    names = []
    for choice in choices:
        if isinstance(choice.value, bool):
            names.append("true" if choice.value else "false")
        elif option_identity(choice.value) in booleans:
            names.append(f'"{choice.value}"')
        else:
            names.append(choice.value)
    return names


class DecisionChoiceQuestion(_Question):
    """One of 2–255 typed values: the string ``"true"`` and the boolean ``true`` are two options."""

    choices: list[Choice] = Field(json_schema_extra={"minItems": MIN_OPTIONS, "maxItems": MAX_OPTIONS})
    instructions: Instructions
    type: Literal["choice"]
    name: str | None = None
    # -- opendecide extensions
    debias: Debias = None
    rotations: Rotations = None
    min_confidence: MinConfidence = None

    @field_validator("choices")
    @classmethod
    def check_choices(cls, choices: list[Choice]) -> list[Choice]:
        if not MIN_OPTIONS <= len(choices) <= MAX_OPTIONS:
            raise ValueError(f"a choice needs {MIN_OPTIONS} to {MAX_OPTIONS} choices, got {len(choices)}")
        # Values are typed: "true" and true are two choices. Strings are compared as the Jev route
        # compares option names (service.protocol.questions.first_duplicate: "Ａ" and "A", or Cyrillic
        # "а" and Latin "a", are one option) and bounded as they are.
        for index, choice in enumerate(choices):
            if isinstance(choice.value, str):
                if len(choice.value) > MAX_OPTION_NAME_CHARS:
                    raise ValueError(
                        f"choices[{index}].value has {len(choice.value)} characters; at most {MAX_OPTION_NAME_CHARS}"
                    )
                if not option_identity(choice.value):
                    raise ValueError(f"choices[{index}].value must not be empty")
        # A string that is a boolean choice's text but for its case ("True" beside true) is refused:
        # to a reader they are one answer spelt twice, and such a pair is a caller's slip (Python's
        # spelling of the boolean), not two answers anybody means.
        booleans = {
            ("true" if c.value else "false"): index
            for index, c in enumerate(choices)
            if isinstance(c.value, bool)
        }
        for index, choice in enumerate(choices):
            if isinstance(choice.value, str):
                identity = option_identity(choice.value)
                folded = identity.casefold()
                if folded in booleans and identity != folded:
                    raise ValueError(
                        f"choices[{index}] ({choice.value!r}) and choices[{booleans[folded]}] "
                        f"({folded}) differ only by case"
                    )
        # Distinct typed values must also read as distinct names: the string '"true"' reads exactly
        # as the string "true" does once quoted beside a boolean true. Two choices read alike would be
        # one option, and the answer could not tell which value it meant.
        if duplicate := first_duplicate(option_names(choices)):
            first, second = duplicate
            raise ValueError(
                f"choices[{first}] and choices[{second}] have the same value or would be read as one "
                "(look-alike characters, or a string quoted beside a boolean reads as another)"
            )
        return choices

    def option_names(self) -> list[str]:
        """The names the model reads, one per choice in order (see :func:`option_names`)."""
        return option_names(self.choices)

    def to_jev(self) -> ChoiceQuestion:
        criteria = {
            name: choice.description for name, choice in zip(self.option_names(), self.choices, strict=True)
        }
        # check_choices made the names distinct; a merged key would silently drop a choice.
        assert len(criteria) == len(self.choices), "two choices read as one name"
        return ChoiceQuestion.model_validate(
            {
                "type": "choice",
                "instructions": self.instructions_text(),
                "criteria": criteria,
                **self.read_options(),
            }
        )


class Level(RequestModel):
    label: str = Field(min_length=1)
    description: str | None = None


class DecisionScoreQuestion(_Question):
    """Ordered levels, counted from 0 (``value`` in the answer)."""

    instructions: Instructions
    levels: list[Level] = Field(json_schema_extra={"minItems": MIN_LEVELS, "maxItems": MAX_LEVELS})
    type: Literal["score"]
    name: str | None = None
    # -- opendecide extensions
    debias: Debias = None
    rotations: Rotations = None
    min_confidence: MinConfidence = None

    @field_validator("levels")
    @classmethod
    def check_level_count(cls, levels: list[Level]) -> list[Level]:
        if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
            raise ValueError(f"a score needs {MIN_LEVELS} to {MAX_LEVELS} levels, got {len(levels)}")
        if duplicate := first_duplicate([level.label for level in levels]):
            first, second = duplicate
            raise ValueError(f"levels[{first}] and levels[{second}] have the same label")
        return levels

    def to_jev(self) -> ScoreQuestion:
        # A level is its label, or "label: description": Jev's criteria are one text per level.
        criteria = [
            f"{level.label}: {level.description}" if level.description else level.label
            for level in self.levels
        ]
        return ScoreQuestion.model_validate(
            {
                "type": "score",
                "instructions": self.instructions_text(),
                "criteria": criteria,
                **self.read_options(),
            }
        )


DecisionQuestion = Annotated[
    DecisionPredicateQuestion | DecisionChoiceQuestion | DecisionScoreQuestion, Field(discriminator="type")
]


class PromptCacheOptions(RequestModel):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


class DecisionRequest(BodyModel):
    """``POST /v1/decisions``: the SDK's ``DecisionCreateParams``."""

    input: str | list[InputItem]
    model: str
    questions: list[DecisionQuestion] = Field(json_schema_extra={"minItems": 1, "maxItems": MAX_QUESTIONS})
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = Field(default=None, max_length=256)

    @field_validator("questions")
    @classmethod
    def check_question_count(cls, questions: list) -> list:
        if not 1 <= len(questions) <= MAX_QUESTIONS:
            raise ValueError(f"a request asks 1 to {MAX_QUESTIONS} questions, got {len(questions)}")
        return questions

    def images_in(self) -> tuple[str | int, ...] | None:
        """Where the first ``input_image`` part of a question's instructions is (a path under the
        body), or None: those are refused, the input's are read (``input_images``)."""
        for index, question in enumerate(self.questions):
            if isinstance(question.instructions, list):
                for at, part in enumerate(question.instructions):
                    if isinstance(part, InputImage):
                        return ("questions", index, "instructions", at)
        return None

    def input_images(self) -> list[tuple[tuple[str | int, ...], InputImage]]:
        """Every ``input_image`` part of ``input`` (messages and tool outputs), in order, with its path
        under the body: the state's images."""
        found: list[tuple[tuple[str | int, ...], InputImage]] = []
        if isinstance(self.input, list):
            for index, item in enumerate(self.input):
                parts = item.content if isinstance(item, Message) else getattr(item, "output", "")
                field = "content" if isinstance(item, Message) else "output"
                if isinstance(parts, list):
                    for at, part in enumerate(parts):
                        if isinstance(part, InputImage):
                            found.append((("input", index, field, at), part))
        return found
