"""One decision request → answers: every question read concurrently, answers in Jev's shape."""

from __future__ import annotations

import asyncio

from readers.prompt import PROMPT_VERSION
from readers.reader import QuestionReading, Reader
from service.protocol import (
    Answer,
    BatchRequest,
    BatchResponse,
    BatchResult,
    ChoiceAnswer,
    NoulAnswer,
    Provenance,
    Reading,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
)

# Jev model names a client may send unchanged; they select the model this server serves.
JEV_ALIASES = ("jev-latest", "jev-preview")


async def decide(request: SystemOneRequest, reader: Reader, *, request_id: str) -> SystemOneResponse:
    """Read every question of ``request`` and build the response."""
    state = request.state_text()
    names = list(request.questions)
    readings = await asyncio.gather(
        *(
            reader.read(request.questions[name].to_spec(), state, loc=("body", "questions", name))
            for name in names
        )
    )
    answers = {name: build_answer(request.questions[name], reading) for name, reading in zip(names, readings)}
    engine = reader.engine
    return SystemOneResponse(
        model=engine.info.name,
        answers=answers,
        usage=Usage(input_tokens=sum(r.prompt_tokens for r in readings), output_tokens=len(readings)),
        provenance=Provenance(
            engine=engine.kind,
            model=engine.info.name,
            model_revision=engine.info.revision,
            read_mode=engine.capabilities.read_mode.value,
            top_k=engine.capabilities.top_k,
            prompt_version=PROMPT_VERSION,
            request_id=request_id,
        ),
    )


async def decide_batch(request: BatchRequest, reader: Reader, *, request_id: str) -> BatchResponse:
    """Every state × question read concurrently; the engine's own in-flight limit bounds the load."""
    responses = await asyncio.gather(*(decide(one, reader, request_id=request_id) for one in request.requests()))
    return BatchResponse(
        model=reader.engine.info.name,
        results=[BatchResult(answers=r.answers, usage=r.usage) for r in responses],
        usage=Usage(
            input_tokens=sum(r.usage.input_tokens for r in responses),
            output_tokens=sum(r.usage.output_tokens for r in responses),
        ),
        provenance=responses[0].provenance,
    )


def build_reading(reading: QuestionReading) -> Reading:
    options = reading.question.options
    read = reading.read
    return Reading(
        read_mode=reading.mode,
        label_style=reading.label_style.value,
        labels=dict(zip(options, reading.labels)),
        labels_returned=read.labels_returned,
        labels_total=len(options),
        exact=read.exact,
        informative=read.informative,
        floor_used=read.floor_used,
        floor_logprob=read.floor,
        label_mass=read.label_mass,
        label_logprobs=dict(zip(options, read.logprobs)),
        probability_bounds=dict(zip(options, read.bounds)),
        raw_probabilities=dict(zip(options, read.probabilities)),
        calibration=None,
        prompt_tokens=reading.prompt_tokens,
        engine_latency_ms=round(reading.engine_latency_ms, 3),
        latency_ms=round(reading.latency_ms, 3),
    )


def build_answer(question, reading: QuestionReading) -> Answer:
    """Jev's answer fields from a reading.

    An uninformative read (no label came back) is an abstention: probabilities are the floor's tie,
    ``confidence`` is 0 and ``reading.informative`` is false, so no client takes it as an answer.
    """
    extension = build_reading(reading)
    probabilities = extension.raw_probabilities
    informative = reading.read.informative
    if reading.question.kind == "noul":
        return NoulAnswer(noul=probabilities["true"], reading=extension)
    best = max(probabilities, key=probabilities.__getitem__)
    confidence = probabilities[best] if informative else 0.0
    if reading.question.kind == "choice":
        return ChoiceAnswer(choice=best, confidence=confidence, probabilities=probabilities, reading=extension)
    assert isinstance(question, ScoreQuestion)
    return ScoreAnswer(
        score=sum(int(level) * p for level, p in probabilities.items()),
        confidence=confidence,
        legend={str(level): text for level, text in enumerate(question.criteria)},
        probabilities=probabilities,
        reading=extension,
    )
