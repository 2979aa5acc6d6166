"""Wire models: Jev's System One format, plus our namespaced extensions. Nothing else declares them.

Fields follow Jev's order (``typesafe-sdk`` 0.7 / the public OpenAPI schema). Our extensions sit
below the ``# -- opendecide extensions`` markers: ``reading`` on each answer and ``provenance`` on
the response. Jev clients ignore unknown response fields, so they are safe to add.

Requests forbid unknown fields, and each rule is one named validator raising with the field, so a
bad request is a 422 naming it, never a 500.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from readers.prompt import QuestionSpec, content_text

Content = str | dict[str, Any] | list[Any]
"""Text, a JSON object or an array, as Jev accepts for state, instructions and criteria."""

MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_QUESTIONS = 64


class RequestModel(BaseModel):
    """Request-side policy: unknown fields are an error naming the field."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _described(value: Content | None) -> bool:
    return value is not None and value != "" and value != {} and value != []


# ---------------------------------------------------------------------------------------------
# Questions


class NoulCriteria(RequestModel):
    true: Content | None = None
    false: Content | None = None


class NoulQuestion(RequestModel):
    """A yes/no question; ``noul`` in the answer is P(true)."""

    type: Literal["noul"]
    instructions: Content | None = None
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def check_asks_something(self) -> NoulQuestion:
        criteria = self.criteria or NoulCriteria()
        if not _described(self.instructions) and not (_described(criteria.true) or _described(criteria.false)):
            raise ValueError("a noul question needs instructions or a described outcome in criteria")
        return self

    def to_spec(self) -> QuestionSpec:
        criteria = self.criteria or NoulCriteria()
        return QuestionSpec(
            kind="noul",
            instructions=_text_or_none(self.instructions),
            options=("true", "false"),
            descriptions=(_text_or_none(criteria.true), _text_or_none(criteria.false)),
        )


class ChoiceQuestion(RequestModel):
    """One of 2–255 named options; descriptions may be null."""

    type: Literal["choice"]
    instructions: Content | None = None
    criteria: dict[str, Content | None]

    @field_validator("criteria")
    @classmethod
    def check_option_count(cls, criteria: dict[str, Content | None]) -> dict[str, Content | None]:
        if not MIN_OPTIONS <= len(criteria) <= MAX_OPTIONS:
            raise ValueError(f"a choice needs {MIN_OPTIONS} to {MAX_OPTIONS} options, got {len(criteria)}")
        return criteria

    @field_validator("criteria")
    @classmethod
    def check_option_names(cls, criteria: dict[str, Content | None]) -> dict[str, Content | None]:
        seen: dict[str, str] = {}
        for name in criteria:
            if not name.strip():
                raise ValueError("option names must not be empty")
            key = name.strip()
            if key in seen:
                raise ValueError(f"duplicate options {seen[key]!r} and {name!r}")
            seen[key] = name
        return criteria

    def to_spec(self) -> QuestionSpec:
        return QuestionSpec(
            kind="choice",
            instructions=_text_or_none(self.instructions),
            options=tuple(self.criteria),
            descriptions=tuple(_text_or_none(value) for value in self.criteria.values()),
        )


class ScoreQuestion(RequestModel):
    """A rubric of 2–10 ordered levels, counted from 0."""

    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content]

    @field_validator("criteria")
    @classmethod
    def check_level_count(cls, criteria: list[Content]) -> list[Content]:
        if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
            raise ValueError(f"a score needs {MIN_LEVELS} to {MAX_LEVELS} levels, got {len(criteria)}")
        return criteria

    def to_spec(self) -> QuestionSpec:
        return QuestionSpec(
            kind="score",
            instructions=_text_or_none(self.instructions),
            options=tuple(str(level) for level in range(len(self.criteria))),
            descriptions=tuple(content_text(level) for level in self.criteria),
        )


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


def _text_or_none(value: Content | None) -> str | None:
    return content_text(value) if _described(value) else None


class SystemOneRequest(RequestModel):
    """``POST /v1/systemone`` and ``POST /decide``."""

    model: str | None = None
    state: Content
    questions: dict[str, Question]
    assets: Any = None
    # -- opendecide extensions
    domain: str | None = Field(default=None, max_length=200, description="calibration domain tag (optional)")

    @field_validator("questions")
    @classmethod
    def check_has_questions(cls, questions: dict[str, Question]) -> dict[str, Question]:
        if not 1 <= len(questions) <= MAX_QUESTIONS:
            raise ValueError(f"a request asks 1 to {MAX_QUESTIONS} questions, got {len(questions)}")
        return questions

    @field_validator("assets")
    @classmethod
    def check_no_assets(cls, assets: Any) -> None:
        if assets is not None:
            raise ValueError("image assets need a vision model; this server reads text decisions only")
        return None

    def state_text(self) -> str:
        return content_text(self.state)


MAX_BATCH_STATES = 1024
MAX_BATCH_READS = 4096


class BatchRequest(RequestModel):
    """``POST /decide/batch``: many states, the same questions (opendecide extension)."""

    model: str | None = None
    states: list[Content] = Field(min_length=1, max_length=MAX_BATCH_STATES)
    questions: dict[str, Question]
    domain: str | None = Field(default=None, max_length=200)

    @field_validator("questions")
    @classmethod
    def check_has_questions(cls, questions: dict[str, Question]) -> dict[str, Question]:
        return SystemOneRequest.check_has_questions(questions)

    @model_validator(mode="after")
    def check_total_reads(self) -> BatchRequest:
        if len(self.states) * len(self.questions) > MAX_BATCH_READS:
            raise ValueError(f"a batch reads at most {MAX_BATCH_READS} states × questions, got {len(self.states) * len(self.questions)}")
        return self

    def requests(self) -> list[SystemOneRequest]:
        return [
            SystemOneRequest.model_construct(model=self.model, state=state, questions=self.questions, assets=None, domain=self.domain)
            for state in self.states
        ]


# ---------------------------------------------------------------------------------------------
# Answers


class CalibrationUsed(ResponseModel):
    id: str
    temperature: float
    n: int


class Reading(ResponseModel):
    """How an answer was read (opendecide extension; Jev clients ignore it)."""

    decision_id: str = Field(description="send it to POST /v1/feedback with the true answer")
    read_mode: Literal["exact", "masked", "topk"]
    label_style: Literal["words", "codes", "digits"]
    labels: dict[str, str] = Field(description="option (or level) → the label token text it was read from")
    labels_returned: int
    labels_total: int
    exact: bool = Field(description="every label's log-prob came back from the engine")
    informative: bool = Field(description="false when no label came back: the answer is an abstention")
    floor_used: bool
    floor_logprob: float | None
    label_mass: float | None = Field(description="vocabulary probability on the returned labels; null when masked")
    label_logprobs: dict[str, float | None] = Field(description="as returned; null where missing")
    probability_bounds: dict[str, tuple[float, float]]
    raw_probabilities: dict[str, float]
    calibration: CalibrationUsed | None = None
    prompt_tokens: int
    engine_latency_ms: float
    queued_ms: float = Field(description="time waiting for a free engine slot")
    latency_ms: float


class NoulAnswer(ResponseModel):
    type: Literal["noul"] = "noul"
    noul: float
    # -- opendecide extensions
    reading: Reading


class ChoiceAnswer(ResponseModel):
    type: Literal["choice"] = "choice"
    choice: str
    confidence: float
    probabilities: dict[str, float]
    # -- opendecide extensions
    reading: Reading


class ScoreAnswer(ResponseModel):
    type: Literal["score"] = "score"
    score: float
    confidence: float
    legend: dict[str, Content]
    probabilities: dict[str, float]
    # -- opendecide extensions
    reading: Reading


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class Usage(ResponseModel):
    input_tokens: int = Field(description="prompt tokens over all questions, from the served tokenizer")
    output_tokens: int = Field(description="one answer token per question")


class Provenance(ResponseModel):
    """Which engine, model and prompt produced the answers (opendecide extension)."""

    engine: str
    model: str
    model_revision: str
    read_mode: Literal["exact", "masked", "topk"]
    top_k: int
    prompt_version: str
    request_id: str


class SystemOneResponse(ResponseModel):
    model: str
    answers: dict[str, Answer]
    usage: Usage
    # -- opendecide extensions
    provenance: Provenance


class BatchResult(ResponseModel):
    answers: dict[str, Answer]
    usage: Usage


class BatchResponse(ResponseModel):
    """One result per state, in request order."""

    model: str
    results: list[BatchResult]
    usage: Usage
    provenance: Provenance


# ---------------------------------------------------------------------------------------------
# Calibration (opendecide extension)

Gold = bool | int | str
"""A true answer: noul true/false, a choice option's name, a score level (0-based)."""


class LabelledExample(RequestModel):
    state: Content
    questions: dict[str, Question]
    gold: dict[str, Gold]

    @model_validator(mode="after")
    def check_gold_names_questions(self) -> LabelledExample:
        missing = set(self.questions) - set(self.gold)
        extra = set(self.gold) - set(self.questions)
        if missing or extra:
            raise ValueError(f"gold must answer every question and only those (missing {sorted(missing)}, unknown {sorted(extra)})")
        return self


class CalibrationRequest(RequestModel):
    """``POST /v1/calibrations``: labelled decisions to fit temperatures on."""

    model: str | None = None
    domain: str | None = Field(default=None, max_length=200)
    examples: list[LabelledExample] = Field(min_length=1, max_length=5000)
    seed: int = 0


class CalibrationOut(ResponseModel):
    id: str
    model: str
    revision: str
    question_type: str
    option_count: int | None
    domain: str | None
    temperature: float
    n: int
    nll_before: float | None
    nll_after: float | None
    heldout_n: int | None
    heldout_ece_before: float | None = Field(description="ECE (15 bins) at T = 1 on the held-out half")
    heldout_ece_after: float | None = Field(description="ECE (15 bins) with T fitted on the other half")
    source: str
    fitted_at: str


class CalibrationList(ResponseModel):
    calibrations: list[CalibrationOut]


class FeedbackRequest(RequestModel):
    decision_id: str
    gold: Gold


class FeedbackResponse(ResponseModel):
    decision_id: str
    recorded: int = Field(description="feedback sequence number: the write is durable")
    labelled: int = Field(description="labelled decisions now stored for this decision's calibration key")
    refit: CalibrationOut | None = None


class RefitRequest(RequestModel):
    question_type: Literal["noul", "choice", "score"]
    option_count: int | None = None
    domain: str | None = None
    model: str | None = None

    @model_validator(mode="after")
    def check_domain_has_count(self) -> RefitRequest:
        # Lookups go domain → type + count → type: a domain calibration without a count is never applied.
        if self.domain is not None and self.option_count is None:
            raise ValueError("a domain calibration needs option_count")
        return self


# ---------------------------------------------------------------------------------------------
# Models and errors


class ModelCard(ResponseModel):
    name: str
    description: str
    release_date: str
    # -- opendecide extensions
    revision: str
    engine: str
    read_mode: Literal["exact", "masked", "topk"]
    max_logprobs: int
    top_k: int
    context_length: int
    aliases: list[str]


class ModelList(ResponseModel):
    models: list[ModelCard]


class ErrorDetail(ResponseModel):
    message: str
    type: str
    param: str | None = None
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool | None = None
    context_length: int | None = None


class ErrorResponse(ResponseModel):
    """Every non-validation error. Validation errors keep FastAPI's (and Jev's) ``detail`` list."""

    detail: ErrorDetail
