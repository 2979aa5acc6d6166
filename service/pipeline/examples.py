"""Fitting from examples with gold answers (``POST /v1/calibrations``): read each example, then fit and store.

Examples carry gold answers, except for ``state_prior``, which fits on the states alone (gold answers
given with it are used only to report held-out scores).

The fit itself (``calibration/fit.py``) needs no engine; this module reads the examples through the
reader as answers are read (``reads.to_read``, the served prior), which is why it lives in the pipeline.
"""

from __future__ import annotations

import asyncio

from calibration.fit import MIN_GOLD, fit_and_store, gold_index
from calibration.store import DEFAULT_TENANT, Calibration, CalibrationKey, CalibrationStore
from readers.errors import InvalidQuestion
from readers.prompt import content_text
from readers.reader import Reader
from service.pipeline.decide import calibration_key, corrected_read
from service.pipeline.prior import OptionPriors, served_prior
from service.pipeline.reads import read_planned, to_read
from service.protocol import CalibrationRequest


async def fit_from_examples(
    request: CalibrationRequest,
    reader: Reader,
    store: CalibrationStore,
    *,
    concurrency: int = 8,
    priors: OptionPriors | None = None,
    tenant: str = DEFAULT_TENANT,
) -> list[Calibration]:
    """Read every example (uncalibrated; with the prior divided out where ``priors`` cover the
    question, as answers are read), group by key, fit and store each group as ``tenant``'s fits, or
    as shared ones where the request says ``shared`` (the route checks the caller may)."""
    info = reader.engine.info
    gate = asyncio.Semaphore(concurrency)
    jobs = []
    for i, example in enumerate(request.examples):
        state = example.state
        if example.gold is None and request.mode != "state_prior":
            raise InvalidQuestion(
                f"a {request.mode or 'default-mode'} calibration needs the gold answers; only mode state_prior fits without",
                loc=("body", "examples", i, "gold"),
            )
        for name, question in example.questions.items():
            plan = to_read(question, ("body", "examples", i, "questions", name))
            spec = plan.spec
            loc = ("body", "examples", i, "gold", name)
            try:
                gold = (
                    None
                    if example.gold is None
                    else gold_index(spec.question_type, spec.options, example.gold[name])
                )
            except ValueError as error:
                raise InvalidQuestion(str(error), loc=loc) from None
            jobs.append((plan, state, gold))

    async def read(plan, state, gold: int | None):
        # Read as the service reads the question (its rotations, the prior where served), so the fit
        # lands on the key its answers look up, made on the reads it will be applied to.
        async with gate:
            (reading,) = await read_planned(reader, [plan], content_text(state))
        read = reading.label_probabilities
        prior = await served_prior(priors, reader, reading)
        key = calibration_key(info, reading, request.domain, corrected=prior is not None, tenant=tenant)
        row = ([float(p) for p in corrected_read(read.probabilities, prior)], gold)
        return key, row, reading.features, read.informative

    groups: dict[CalibrationKey, list[tuple[list[float], int | None]]] = {}
    features: dict[CalibrationKey, list] = {}
    for key, row, state, informative in await asyncio.gather(*(read(*job) for job in jobs)):
        if informative:  # an uninformative read (no label came back) carries nothing to fit on
            groups.setdefault(key, []).append(row)
            features.setdefault(key, []).append(state)
    short = {key: len(rows) for key, rows in groups.items() if len(rows) < MIN_GOLD}
    if short or not groups:
        described = (
            ", ".join(f"{k.question_type} with {k.option_count} options: {n}" for k, n in short.items())
            or "none"
        )
        what = (
            "readable decisions" if request.mode == "state_prior" else "readable decisions with gold answers"
        )
        raise InvalidQuestion(
            f"each question type and option count needs at least {MIN_GOLD} {what} ({described})",
            loc=("body", "examples"),
        )
    source = "states" if request.mode == "state_prior" else "examples"
    return [
        await asyncio.to_thread(
            fit_and_store,
            store,
            key,
            rows,
            source=source,
            seed=request.seed,
            mode=request.mode,  # None: the defaults at this key's gold answers, stored as theirs
            shared=request.shared,
            features=features[key],
        )
        for key, rows in sorted(
            groups.items(), key=lambda item: (item[0].question_type, item[0].option_count)
        )
    ]
