"""One decision request → answers: every question read concurrently, answers in Jev's shape."""

from __future__ import annotations

import asyncio
import uuid

from calibration.bias import apply_prior, apply_temperature_bias
from calibration.probe import FoldedProbe
from calibration.store import (
    BIAS_MODES,
    DEFAULT_TENANT,
    FEATURE_MODES,
    Calibration,
    CalibrationKey,
    CalibrationStore,
    DecisionRecord,
)
from calibration.temperature import apply_temperature, as_logits
from readers.debias import RotatedReading
from readers.engines.base import ModelInfo
from readers.images import state_images
from readers.prompt import CURRENT_LAYOUT, PROMPT_VERSION
from readers.reader import Reader, Reading
from service.pipeline.abstain import abstains
from service.pipeline.confidence import answer_confidence
from service.pipeline.images import ServedImages
from service.pipeline.prior import OptionPrior, OptionPriors, read_version, served_prior
from service.pipeline.reads import read_planned, to_read
from service.protocol import (
    Answer,
    BatchRequest,
    BatchResponse,
    BatchResult,
    CalibrationUsed,
    ChoiceAnswer,
    NoulAnswer,
    PriorUsed,
    Provenance,
    ReadingOut,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
)


async def decide(
    request: SystemOneRequest,
    reader: Reader,
    *,
    request_id: str,
    store: CalibrationStore | None = None,
    images: ServedImages = ServedImages(),
    priors: OptionPriors | None = None,
    affinity_key: str | None = None,
    tenant: str = DEFAULT_TENANT,
) -> SystemOneResponse:
    """Read every question of ``request``, apply calibrations, record the decisions, respond.

    With ``priors``, the reads of the questions their policy covers have the content-free prior
    divided out before any stored calibration applies. ``affinity_key``: the caller's routing key
    for the reads (OpenAI's ``prompt_cache_key``); it changes where they run, never what they read.
    ``tenant``'s own fits apply first, then the shared ones; the decisions are recorded as ``tenant``'s."""
    response, decisions = await _decide(
        request,
        reader,
        request_id=request_id,
        store=store,
        images=images,
        priors=priors,
        affinity_key=affinity_key,
        tenant=tenant,
    )
    if store is not None:
        await asyncio.to_thread(store.add_decisions, decisions)
    return response


async def decide_batch(
    request: BatchRequest,
    reader: Reader,
    *,
    request_id: str,
    store: CalibrationStore | None = None,
    images: ServedImages = ServedImages(),
    priors: OptionPriors | None = None,
    tenant: str = DEFAULT_TENANT,
) -> BatchResponse:
    """Every state × question read concurrently; the engine's own in-flight limit bounds the load."""
    requests = request.requests()
    outcomes = await asyncio.gather(
        *(
            _decide(
                one, reader, request_id=request_id, store=store, images=images, priors=priors, tenant=tenant
            )
            for one in requests
        )
    )
    if store is not None:
        await asyncio.to_thread(store.add_decisions, [d for _, decisions in outcomes for d in decisions])
    responses = [response for response, _ in outcomes]
    return BatchResponse(
        model=reader.engine.info.name,
        results=[BatchResult(answers=r.answers, usage=r.usage) for r in responses],
        usage=Usage(
            input_tokens=sum(r.usage.input_tokens for r in responses),
            output_tokens=sum(r.usage.output_tokens for r in responses),
        ),
        provenance=responses[0].provenance,
    )


async def _decide(
    request: SystemOneRequest,
    reader: Reader,
    *,
    request_id: str,
    store: CalibrationStore | None,
    images: ServedImages,
    priors: OptionPriors | None = None,
    affinity_key: str | None = None,
    tenant: str = DEFAULT_TENANT,
) -> tuple[SystemOneResponse, list[DecisionRecord]]:
    # The state's text, carrying its images for an engine that reads them (refused before here for
    # one that does not: service/decision_route.py).
    state = request.state_for_reading()
    names = list(request.questions)
    # One engine call for all questions (and their rotations): their prompts share the state, which
    # the engine reads once.
    readings = await read_planned(
        reader,
        [to_read(request.questions[name], ("body", "questions", name)) for name in names],
        state,
        affinity_key=affinity_key,
    )
    engine = reader.engine
    digests = [image.sha256 for image in state_images(state)]
    answers, decisions = {}, []
    # New questions' priors are measured together (three reads each, once per question per process).
    served = await asyncio.gather(*(served_prior(priors, reader, reading) for reading in readings))
    for name, reading, prior in zip(names, readings, served):
        key = calibration_key(
            engine.info, reading, request.domain, corrected=prior is not None, tenant=tenant
        )
        calibration = store.lookup(key) if store is not None else None
        probe = await probe_of(store, calibration, reading)
        answer = build_answer(request.questions[name], reading, calibration, prior, probe)
        if digests:
            answer.reading.images = digests
        answers[name] = answer
        decisions.append(
            DecisionRecord(
                id=answer.reading.decision_id,
                model=key.model,
                revision=key.revision,
                question_type=key.question_type,
                option_count=key.option_count,
                domain=key.domain,
                options=list(reading.question.options),
                # What the key's fits are made on and applied to: the read, prior-corrected under a +prior key.
                uncalibrated_probabilities=[
                    float(p) for p in corrected_read(reading.label_probabilities.probabilities, prior)
                ],
                informative=reading.label_probabilities.informative,
                read_version=key.read_version,
                tenant=tenant,
                features=reading.features,
            )
        )
    response = SystemOneResponse(
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
            engine_image=images.engine,
            service_image=images.service,
            reads_images=engine.capabilities.images,
        ),
    )
    return response, decisions


def calibration_key(
    info: ModelInfo,
    reading: Reading,
    domain: str | None,
    *,
    corrected: bool = False,
    tenant: str = DEFAULT_TENANT,
) -> CalibrationKey:
    """The reading's calibration key among ``tenant``'s fits: the prompt version this service reads
    with, marked where the prior was divided out of the read (``corrected``), so fits are applied to
    reads made as theirs were."""
    question = reading.question
    return CalibrationKey(
        info.name,
        info.revision,
        question.question_type,
        len(question.options),
        domain,
        read_version=read_version(
            CURRENT_LAYOUT.read_version_for(question.question_type, len(question.options)), corrected
        ),
        tenant=tenant,
    )


def calibration_used(reading: Reading, calibration: Calibration | None) -> CalibrationUsed | None:
    """What ``x_reading.calibration`` reports: the stored fit, or nothing."""
    if calibration is None:
        return None
    return CalibrationUsed(
        mode=calibration.mode, id=calibration.id, temperature=calibration.temperature, n=calibration.n,
        bias=dict(zip(reading.question.options, calibration.bias)) if calibration.bias is not None else None, read_version=calibration.read_version,
    )  # fmt: skip


def corrected_read(raw, prior: OptionPrior | None):
    """The read a stored fit applies to: raw label probabilities with the prior divided out, where one applies."""
    return apply_prior(raw, prior.prior) if prior is not None else raw


async def probe_of(
    store: CalibrationStore | None, calibration: Calibration | None, reading: Reading
) -> FoldedProbe | None:
    """A ``probe`` calibration's weights where ``reading`` can take them (it came with the hidden
    state): from the store's probe cache, or read from the store on first use, once for the answers
    that ask together (``CalibrationStore.probe``; the lookup cache holds no weights:
    calibration/probe_cache.py)."""
    if (
        store is None
        or calibration is None
        or calibration.mode not in FEATURE_MODES
        or not reading.label_probabilities.informative  # no calibration applies: nothing to load
        or reading.features is None
        or len(reading.features) != calibration.probe_dimension
    ):
        return None
    return await store.probe(calibration)


def calibrated_probabilities(
    raw,
    calibration: Calibration | None,
    prior: OptionPrior | None,
    features=None,
    probe: FoldedProbe | None = None,
):
    """Raw label probabilities with the prior divided out (where one applies), then through the
    stored fit (its mode, where one applies; a probe, ``probe``, reads the answer slot's hidden state,
    ``features``)."""
    read = corrected_read(raw, prior)
    if calibration is not None and calibration.mode in FEATURE_MODES:
        if probe is None:  # applies() keeps such a calibration out of every answer
            raise ValueError(f"calibration {calibration.id} is a probe: its weights are needed")
        return probe.apply(as_logits(read), features)
    if calibration is not None and calibration.mode in BIAS_MODES:
        return apply_temperature_bias(as_logits(read), calibration.temperature, calibration.bias)
    if calibration is not None:
        return apply_temperature(as_logits(read), calibration.temperature)
    return read


def build_reading(
    reading: Reading,
    calibration: Calibration | None = None,
    probabilities: dict[str, float] | None = None,
    prior: OptionPrior | None = None,
    *,
    abstained: bool | None = None,
) -> ReadingOut:
    """The ``x_reading`` extension; ``probabilities`` are the answer's (calibrated) ones, for
    ``top_probability``; ``abstained`` defaults to whether the read is uninformative (no label came back)."""
    options = reading.question.options
    rotated = isinstance(reading, RotatedReading)
    read = reading.label_probabilities
    raw = dict(zip(options, read.probabilities))
    return ReadingOut(
        decision_id=f"dec_{uuid.uuid4().hex}",
        read_mode=reading.read_mode,
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
        raw_probabilities=raw,
        top_probability=max((probabilities or raw).values()),
        prior_correction=PriorUsed(
            prior=dict(zip(options, prior.prior)),
            content_free_states=list(prior.states),
            prompt_version=prior.prompt_version,
        )
        if prior
        else None,
        calibration=calibration_used(reading, calibration),
        prompt_tokens=reading.prompt_tokens,
        engine_latency_ms=round(reading.engine_latency_ms, 3),
        queued_ms=round(reading.queued_ms, 3),
        latency_ms=round(reading.latency_ms, 3),
        abstained=not reading.label_probabilities.informative if abstained is None else abstained,
        rotations=reading.rotations if rotated else 1,
        rotation_agreement=reading.rotation_agreement if rotated else None,
        engine_calls=reading.engine_calls,
        tokens_computed=reading.tokens_computed,
        tokens_reused=reading.tokens_reused,
    )


def applies(calibration: Calibration | None, reading: Reading, probe: FoldedProbe | None = None) -> bool:
    """Whether a stored fit can be applied to ``reading``: a probe only to a read that came with the
    answer slot's hidden state of its size (a fit made on the local engine, looked up by a replica
    reading through vLLM, is not applied: the answer says no calibration was), and only with its
    weights (None: the fit was pruned by another replica before this one's cache saw its successor)."""
    if calibration is None or calibration.mode not in FEATURE_MODES:
        return True
    return probe is not None and reading.features is not None and len(reading.features) == probe.dimension


def build_answer(
    question,
    reading: Reading,
    calibration: Calibration | None = None,
    prior: OptionPrior | None = None,
    probe: FoldedProbe | None = None,
) -> Answer:
    """Jev's answer fields from a reading: the prior divided out where one applies, then the stored
    calibration where one applies.

    ``confidence`` is Jev's formula (``confidence.answer_confidence``) over the answer's probabilities;
    the top probability is ``x_reading.top_probability``. An uninformative read (no label came back)
    has the floor's tie for probabilities, ``confidence`` 0 and ``informative`` false, and no
    calibration is applied to it. It is abstained (``x_reading.abstained``), as is an answer below the
    question's ``x_min_confidence``; both keep their Jev fields (``abstain.py``).
    """
    informative = reading.label_probabilities.informative
    calibration = calibration if informative and applies(calibration, reading, probe) else None
    prior = prior if informative else None
    options = reading.question.options
    calibrated = calibrated_probabilities(
        reading.label_probabilities.probabilities, calibration, prior, reading.features, probe
    )
    probabilities = dict(zip(options, (float(p) for p in calibrated)))
    question_type = reading.question.question_type
    abstained = abstains(
        question_type, probabilities, informative=informative, min_confidence=question.min_confidence
    )
    extension = build_reading(reading, calibration, probabilities, prior, abstained=abstained)
    if question_type == "noul":
        return NoulAnswer(noul=probabilities["true"], reading=extension)
    confidence = answer_confidence(question_type, probabilities, informative=informative)
    if question_type == "choice":
        best = max(probabilities, key=probabilities.__getitem__)
        return ChoiceAnswer(
            choice=best, confidence=confidence, probabilities=probabilities, reading=extension
        )
    assert isinstance(question, ScoreQuestion)
    return ScoreAnswer(
        score=sum(int(level) * p for level, p in probabilities.items()),
        confidence=confidence,
        legend={str(level): text for level, text in enumerate(question.criteria)},
        probabilities=probabilities,
        reading=extension,
    )
