"""Calibration on the served route: fit from labelled examples or from feedback, and store.

Each fit stores the temperature fitted on all n labelled decisions of a key, and reports held-out
ECE (15 bins) before and after: a seeded random half fits a temperature, the other half is scored at
T = 1 and at that temperature.
"""

from __future__ import annotations

import asyncio

import numpy as np

from calibration.metrics import N_BINS, ece
from calibration.store import Calibration, CalibrationKey, CalibrationStore
from calibration.temperature import TemperatureScaler, apply_temperature, as_logits
from readers.errors import InvalidQuestion
from readers.prompt import QuestionSpec, content_text
from readers.reader import Reader
from service.protocol import CalibrationRequest, Gold

MIN_LABELS = 10
NOUL_GOLD = {True: 0, "true": 0, "yes": 0, False: 1, "false": 1, "no": 1}


def gold_index(kind: str, options: list[str] | tuple[str, ...], gold: Gold) -> int:
    """The option index a true answer names; ValueError when it names none."""
    if kind == "noul":
        key = gold.lower() if isinstance(gold, str) else gold
        if isinstance(key, bool) or key in ("true", "false", "yes", "no"):
            return NOUL_GOLD[key]
        raise ValueError(f"a noul answer is true or false, not {gold!r}")
    if kind == "score":
        level = gold if isinstance(gold, int) and not isinstance(gold, bool) else int(gold) if isinstance(gold, str) and gold.isdigit() else None
        if level is None or not 0 <= level < len(options):
            raise ValueError(f"a score answer is a level from 0 to {len(options) - 1}, not {gold!r}")
        return level
    if isinstance(gold, str) and gold in options:
        return list(options).index(gold)
    raise ValueError(f"{gold!r} is not one of the options")


def _padded(probabilities: list[np.ndarray]) -> np.ndarray:
    """Rows of different option counts as one array; zero columns change no top label."""
    width = max(len(row) for row in probabilities)
    return np.array([np.pad(row, (0, width - len(row))) for row in probabilities])


def fit_and_store(store: CalibrationStore, key: CalibrationKey, rows: list[tuple[list[float], int]], *, source: str, seed: int = 0) -> Calibration:
    """Fit T on all ``rows`` (raw probabilities, gold index), score a held-out half, store."""
    if len(rows) < MIN_LABELS:
        raise ValueError(f"{len(rows)} labelled decisions; a calibration needs at least {MIN_LABELS}")
    logits = [as_logits(probabilities) for probabilities, _ in rows]
    labels = np.array([gold for _, gold in rows])
    scaler = TemperatureScaler().fit(logits, labels)

    order = np.random.default_rng(seed).permutation(len(rows))
    fit_half, score_half = order[: len(rows) // 2], order[len(rows) // 2 :]
    half = TemperatureScaler().fit([logits[i] for i in fit_half], labels[fit_half])
    raw = _padded([np.exp(logits[i]) / np.exp(logits[i]).sum() for i in score_half])
    calibrated = _padded([apply_temperature(logits[i], half.temperature_) for i in score_half])
    return store.add_calibration(
        key,
        temperature=scaler.temperature_,
        n=scaler.n_samples_,
        source=source,
        nll_before=scaler.nll_before_,
        nll_after=scaler.nll_after_,
        heldout_n=len(score_half),
        heldout_ece_before=ece(raw, labels[score_half], N_BINS),
        heldout_ece_after=ece(calibrated, labels[score_half], N_BINS),
    )


async def fit_from_examples(request: CalibrationRequest, reader: Reader, store: CalibrationStore, *, concurrency: int = 8) -> list[Calibration]:
    """Read every labelled example (raw, uncalibrated), group by key, fit and store each group."""
    info = reader.engine.info
    gate = asyncio.Semaphore(concurrency)
    jobs = []
    for i, example in enumerate(request.examples):
        state = example.state
        for name, question in example.questions.items():
            spec = question.to_spec()
            loc = ("body", "examples", i, "gold", name)
            try:
                gold = gold_index(spec.kind, spec.options, example.gold[name])
            except ValueError as error:
                raise InvalidQuestion(str(error), loc=loc) from None
            jobs.append((spec, state, gold, ("body", "examples", i, "questions", name)))

    async def read(spec: QuestionSpec, state, gold: int, loc):
        async with gate:
            reading = await reader.read(spec, content_text(state), loc=loc)
        key = CalibrationKey(info.name, info.revision, spec.kind, len(spec.options), request.domain)
        return key, (list(reading.read.probabilities), gold), reading.read.informative

    groups: dict[CalibrationKey, list[tuple[list[float], int]]] = {}
    for key, row, informative in await asyncio.gather(*(read(*job) for job in jobs)):
        if informative:  # an abstention carries no information to fit on
            groups.setdefault(key, []).append(row)
    short = {key: len(rows) for key, rows in groups.items() if len(rows) < MIN_LABELS}
    if short or not groups:
        described = ", ".join(f"{k.question_type} with {k.option_count} options: {n}" for k, n in short.items()) or "none"
        raise InvalidQuestion(f"each question type and option count needs at least {MIN_LABELS} readable labelled decisions ({described})", loc=("body", "examples"))
    return [
        await asyncio.to_thread(fit_and_store, store, key, rows, source="labels", seed=request.seed)
        for key, rows in sorted(groups.items(), key=lambda item: (item[0].question_type, item[0].option_count))
    ]
