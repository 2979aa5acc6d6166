"""Helpers the service tests share (plain functions, imported; fixtures stay in ``conftest.py``).

Function engines over the embedded model's real tokenizer, ``/metrics`` text read back as samples, and
the lines a test wants printed at the end of the run."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from calibration.open import open_store
from calibration.store import CalibrationKey
from readers.engines.base import Capabilities, EngineReply, ReadMode, ReadRequest
from readers.engines.function import FunctionEngine
from readers.prompt import CURRENT_LAYOUT
from service.pipeline.prior import read_version

RUN_SUMMARIES: list[str] = []
"""Lines a test wants printed at the end of the run even when it passes (the fuzz run's case count);
``conftest.py`` prints them."""


def function_engine(local_engine, fn, mode=ReadMode.TOPK) -> FunctionEngine:
    """A function engine (named as such: it reaches no model) with the embedded model's tokenizer and info."""
    capabilities = Capabilities(read_mode=mode, max_logprobs=32, top_k=32, probe={"engine": "function"})
    return FunctionEngine(
        fn, tokenizer=local_engine.tokenizer, info=local_engine.info, capabilities=capabilities
    )


def favour_first(request: ReadRequest) -> EngineReply:
    """Every label returned, the first most likely (log-probs −0.5, −1.5, −2.5, …; their mass stays below 1)."""
    logprobs = {token: -0.5 - i for i, token in enumerate(request.label_ids)}
    return EngineReply(logprobs, ReadMode.EXACT, len(request.prompt_ids), 1.0)


def stalled_engine(local_engine, cancelled: list[str]) -> FunctionEngine:
    """A function engine (no model) whose reads never finish; it notes the reads cancelled."""

    async def fn(request):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("read")
            raise

    return function_engine(local_engine, fn, ReadMode.EXACT)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus exposition text → {(sample name, sorted labels): value}."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found, name, **labels) -> float:
    """One sample of ``samples``' result; 0 where it is absent (a counter never moved)."""
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def price(reader, body: dict, priors=None) -> int:
    """What admission charges a /v1/systemone ``body`` (``service/pricing.py``), read by ``reader``."""
    from service.pipeline.reads import to_read
    from service.pricing import distinct_tokens, planned_reads
    from service.protocol import SystemOneRequest

    request = SystemOneRequest.model_validate(body)
    plans = [to_read(question) for question in request.questions.values()]
    return distinct_tokens(reader, planned_reads(reader, plans, [request.state_text()], priors))


def calibrated_store(engine, path):
    """A real SQLite store at ``path`` holding a fit for 3-option choices (prior-corrected reads, the
    default) and one for yes/no questions of ``engine``'s model, so every route must apply them."""
    store = open_store(path)
    info = engine.info
    for question_type, options, corrected, temperature in (("choice", 3, True, 1.7), ("noul", 2, False, 1.3)):
        key = CalibrationKey(
            info.name,
            info.revision,
            question_type,
            options,
            read_version=read_version(CURRENT_LAYOUT.read_version_for(question_type, options), corrected),
        )
        store.add_calibration(key, temperature=temperature, n=50, source="examples")
    return store
