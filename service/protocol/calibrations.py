"""Calibration routes' bodies (opendecide extension): examples with gold answers, feedback, refits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from calibration.fit import Gold
from calibration.store import BIAS_MODES
from service.protocol.base import MAX_ID_CHARS, BodyModel, Content, RequestModel, ResponseModel
from service.protocol.questions import MAX_OPTIONS, MIN_OPTIONS, Question, check_question_names


class CalibrationExample(RequestModel):
    """A state, its questions and their gold answers (which mode ``state_prior`` does without)."""

    state: Content
    questions: dict[str, Question]
    gold: dict[str, Gold] | None = Field(
        default=None, description="the true answer per question; only mode state_prior fits without"
    )

    @field_validator("questions")
    @classmethod
    def check_questions_named(cls, questions: dict[str, Question]) -> dict[str, Question]:
        check_question_names(questions)
        return questions

    @model_validator(mode="after")
    def check_gold_names_questions(self) -> CalibrationExample:
        if self.gold is None:
            return self
        missing = set(self.questions) - set(self.gold)
        extra = set(self.gold) - set(self.questions)
        if missing or extra:
            raise ValueError(
                f"gold must answer every question and only those (missing {sorted(missing)}, unknown {sorted(extra)})"
            )
        return self


CalibrationMode = Literal["temperature", "temperature_bias", "affine", "state_prior", "probe"]
MODE_DESCRIPTION = (
    "temperature: softmax(z / T); temperature_bias: softmax(z / T + b), one L2-regularised bias per option; "
    "affine: softmax(z / T + b) with a prior toward T = 1, b = 0 that fades as gold answers accumulate; "
    "state_prior: softmax(z + b) with b = -log of the mean label probabilities over the states (no gold answers needed); "
    "probe: the mean over 10 fits, each on a bootstrap resample of the gold answers, of softmax(z / T + b + W x), "
    "x the model's hidden state at the answer slot, W one L2-regularised row per option (only on an engine that "
    "returns the state: the local engine); "
    "omitted: the default per question type and number of gold answers (questions of up to 6 options: where the "
    "engine returns the hidden state, probe from 32 gold answers for yes/no and from 16 for choice; elsewhere "
    "temperature_bias from 32 for choice; temperature otherwise; docs/calibration.md)"
)


class CalibrationRequest(BodyModel):
    """``POST /v1/calibrations``: decisions to fit calibrations on (with gold answers, but for ``state_prior``)."""

    model: str | None = None
    mode: CalibrationMode | None = Field(default=None, description=MODE_DESCRIPTION)
    domain: str | None = Field(default=None, max_length=200)
    examples: list[CalibrationExample] = Field(min_length=1, max_length=5000)
    seed: int = Field(default=0, strict=True)
    shared: bool = Field(
        default=False,
        strict=True,
        description="publish the fit as shared: it applies to every tenant's answers that no fit of their own covers (needs the admin scope)",
    )


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
    heldout_ece_after: float | None = Field(
        description="ECE (15 bins) calibrated by the same mode fitted on the other half"
    )
    heldout_ece_floor: float | None = Field(
        default=None,
        description="median ECE that perfectly calibrated draws show at heldout_n (15 bins): ECEs near it are sampling noise",
    )
    source: str
    fitted_at: str
    read_version: str = Field(
        description="the read the fit was made on: the prompt layout, with '+prior' where the prior correction was divided out; it applies only to reads made so"
    )
    mode: CalibrationMode
    mode_chosen_by: Literal["caller", "default"] = Field(
        description="caller: the request named the mode, and refits from feedback keep it; default: the request named none "
        "and got its type's default at n, which refits from feedback apply again at their n"
    )
    bias: list[float] | None = Field(
        default=None,
        description="temperature_bias, affine, state_prior: per-option bias, in option order; probe: its fits' mean bias "
        "(and temperature their geometric mean)",
    )
    probe_dimension: int | None = Field(
        default=None, description="probe: the size of the hidden state its W reads (W itself is not listed)"
    )
    probe_members: int | None = Field(default=None, description="probe: the fits it averages")
    tenant: str | None = Field(description="the tenant whose fit this is; null for a shared fit")
    shared: bool = Field(description="published by an admin key for every tenant")


class CalibrationList(ResponseModel):
    calibrations: list[CalibrationOut]


class FeedbackRequest(BodyModel):
    decision_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    gold: Gold


class FeedbackResponse(ResponseModel):
    decision_id: str
    recorded: int = Field(description="feedback sequence number: the write is durable")
    gold_answers: int = Field(
        description="decisions with gold answers now stored for this decision's calibration key"
    )
    refit: CalibrationOut | None = None
    refit_skipped: str | None = Field(
        default=None,
        description="why an automatic refit due at this feedback was not made (over the refit limit, or the key's records cannot be fitted in its mode); the key keeps its fit",
    )


class RefitRequest(BodyModel):
    question_type: Literal["noul", "choice", "score"]
    mode: CalibrationMode | None = Field(default=None, description=MODE_DESCRIPTION)
    option_count: int | None = Field(default=None, strict=True, ge=MIN_OPTIONS, le=MAX_OPTIONS)
    domain: str | None = None
    model: str | None = None
    shared: bool = Field(
        default=False,
        strict=True,
        description="publish the fit (made on this key's tenant's records) as shared: it applies to every tenant's answers that no fit of their own covers (needs the admin scope)",
    )

    @model_validator(mode="after")
    def check_domain_has_count(self) -> RefitRequest:
        # Lookups go domain → type + count → type: a domain calibration without a count is never applied.
        if self.domain is not None and self.option_count is None:
            raise ValueError("a domain calibration needs option_count")
        if self.mode in BIAS_MODES and self.option_count is None:
            raise ValueError(f"a {self.mode} calibration needs option_count: its biases are per option")
        return self
