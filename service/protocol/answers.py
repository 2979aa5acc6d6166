"""Responses: Jev's answers, plus our extensions ``x_reading`` (per answer) and ``x_provenance``.

Jev clients ignore unknown response fields, so the extensions are safe to add; the ``x_`` prefix keeps
them clear of any field Jev adds later. In Python they are ``reading`` and ``provenance``.

``confidence`` follows Jev's documented formula (``service/pipeline/confidence.py``), not the top probability,
so a threshold tuned on Jev keeps its automation rate; the top probability is ``x_reading.top_probability``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from service.protocol.base import Content, ResponseModel


class PriorUsed(ResponseModel):
    """The content-free prior correction applied to an answer's read (``raw_probabilities`` are before it)."""

    prior: dict[str, float] = Field(
        description="the model's option prior: its mean read of this question on content-free states"
    )
    content_free_states: list[str] = Field(description="the states it was measured on")
    prompt_version: str = Field(description="the prompt layout it was measured under")


class CalibrationUsed(ResponseModel):
    """The stored calibration applied to an answer's probabilities, after the prior correction where
    one applied (``raw_probabilities`` are before both)."""

    mode: Literal["temperature", "temperature_bias", "affine", "state_prior", "probe"] = Field(
        description="temperature: softmax(z / T); temperature_bias and affine: softmax(z / T + b) (affine fitted with a prior toward T = 1, b = 0); state_prior: softmax(z + b), b fitted on states without gold answers; probe: the mean over its fits (bootstrap resamples of the gold answers) of softmax(z / T + b + W x), x the model's hidden state at the answer slot"
    )
    id: str = Field(description="the stored calibration's id")
    temperature: float
    n: int = Field(description="decisions it was fitted on (gold answers, but for state_prior)")
    bias: dict[str, float] | None = Field(
        default=None,
        description="temperature_bias, affine, state_prior: per-option bias b; probe: its fits' mean b",
    )
    read_version: str = Field(
        description="the read it was fitted on and applies to: the prompt version, with '+prior' where those reads had the prior correction divided out"
    )


class ReadingOut(ResponseModel):
    """How an answer was read (opendecide extension; Jev clients ignore it)."""

    decision_id: str = Field(description="send it to POST /v1/feedback with the true answer")
    read_mode: Literal["exact", "masked", "topk"]
    label_style: Literal["words", "first_tokens", "trie", "codes", "code_trie", "digits"] = Field(
        description="how the options were named and read: one-token words/codes/digits, first tokens, or whole names by a token trie"
    )
    labels: dict[str, str] = Field(description="option (or level) → the label token text it was read from")
    labels_returned: int
    labels_total: int
    exact: bool = Field(description="every label's log-prob came back from the engine")
    informative: bool = Field(
        description="false for an uninformative read (no label came back): the answer is abstained"
    )
    floor_used: bool
    floor_logprob: float | None
    label_mass: float | None = Field(
        description="vocabulary probability on the returned labels; null when masked"
    )
    label_logprobs: dict[str, float | None] = Field(description="as returned; null where missing")
    probability_bounds: dict[str, tuple[float, float]]
    raw_probabilities: dict[str, float] = Field(
        description="the model's own read, before any correction or calibration"
    )
    top_probability: float = Field(description="the most probable option's probability in the answer")
    prior_correction: PriorUsed | None = Field(
        default=None,
        description="the content-free prior divided out of the read (decide serve --prior-correction; default: choice questions); null when none",
    )
    calibration: CalibrationUsed | None = None
    prompt_tokens: int
    engine_latency_ms: float
    queued_ms: float = Field(description="time waiting for a free engine slot")
    latency_ms: float
    abstained: bool = Field(
        description="true for an uninformative read (informative false) or a confidence below the question's x_min_confidence: "
        "the Jev fields are kept, but the answer should not be acted on"
    )
    rotations: int = Field(description="option orders read and averaged (x_debias rotate); 1 = read as asked")
    rotation_agreement: float | None = Field(
        description="share of rotations whose most probable option is this answer's; null for 1 rotation"
    )
    engine_calls: int | None = Field(
        default=None,
        description="engine calls the read took: 1, or the token trie's depth on an engine that reads one trie level per call (vLLM)",
    )
    tokens_computed: int | None = Field(
        default=None,
        description="prompt tokens the engine computed for this question's reads (every trie level); null where the engine does not report it",
    )
    tokens_reused: int | None = Field(
        default=None,
        description="prompt tokens of those reads the engine did not compute again (its prefix cache, or another read of the request)",
    )
    images: list[str] | None = Field(
        default=None,
        description="the sha256 (hex) of each image the state carried, in order, so a decision can be traced to its input; null when none",
    )


class NoulAnswer(ResponseModel):
    type: Literal["noul"] = "noul"
    noul: float
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class ChoiceAnswer(ResponseModel):
    type: Literal["choice"] = "choice"
    choice: str
    confidence: float
    probabilities: dict[str, float]
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


class ScoreAnswer(ResponseModel):
    type: Literal["score"] = "score"
    score: float
    confidence: float
    legend: dict[str, Content]
    probabilities: dict[str, float]
    # -- opendecide extensions
    reading: ReadingOut = Field(serialization_alias="x_reading")


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
    engine_image: str | None = Field(
        default=None, description="the engine's container image by digest, when served from one"
    )
    service_image: str | None = Field(
        default=None, description="this service's container image by digest, when run from one"
    )
    reads_images: bool = Field(
        default=False, description="the served model reads images (the engine's start-up probe)"
    )


class SystemOneResponse(ResponseModel):
    model: str
    answers: dict[str, Answer]
    usage: Usage
    # -- opendecide extensions
    provenance: Provenance = Field(serialization_alias="x_provenance")


class BatchResult(ResponseModel):
    answers: dict[str, Answer]
    usage: Usage


class BatchResponse(ResponseModel):
    """One result per state, in request order."""

    model: str
    results: list[BatchResult]
    usage: Usage
    # -- opendecide extensions
    provenance: Provenance = Field(serialization_alias="x_provenance")
