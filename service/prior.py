"""The label-free prior correction, served: each question's option prior, measured once and cached.

A question's prior is what the model answers it with on content-free states
(``calibration.bias.CONTENT_FREE_STATES``), read through the same reader, so the same prompt layout,
as real reads. It depends on the model, its revision, the prompt version and the question itself
(instructions, options, descriptions), which together are the cache key; a new prompt version (a
restart with new code) or another model measures afresh. Nothing is stored: the measurement costs
one read per content-free state, once per question per process.

Applied (``service.decide``) only to reads that no label-fitted calibration covers: a stored fit
was fitted on raw probabilities, so it is not stacked on a prior-corrected one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from calibration.bias import CONTENT_FREE_STATES, option_prior
from readers.errors import EngineError
from readers.prompt import QuestionSpec
from readers.reader import Reader


@dataclass(frozen=True)
class OptionPrior:
    """A question's measured prior, in option order, and what it was measured on."""

    prior: tuple[float, ...]
    states: tuple[str, ...]
    prompt_version: str


async def measure_prior(reader: Reader, question: QuestionSpec, states: tuple[str, ...] = CONTENT_FREE_STATES) -> OptionPrior:
    """Read ``question`` on each content-free state; the prior is their mean (abstentions left out)."""
    readings = [await reader.read(question, state) for state in states]
    used = [(state, r.label_probabilities.probabilities) for state, r in zip(states, readings) if r.label_probabilities.informative]
    if not used:
        raise EngineError("no label came back on any content-free state: the option prior cannot be measured")
    prior = option_prior([probabilities for _, probabilities in used])
    return OptionPrior(tuple(float(q) for q in prior), tuple(state for state, _ in used), reader.layout.version)


class OptionPriors:
    """Per-process cache of measured priors, keyed by (model, revision, prompt version, question).

    Concurrent first requests for one question share one measurement.
    """

    def __init__(self, states: tuple[str, ...] = CONTENT_FREE_STATES) -> None:
        self.states = states
        self._measured: dict[tuple, asyncio.Task[OptionPrior]] = {}

    async def prior(self, reader: Reader, question: QuestionSpec) -> OptionPrior:
        info = reader.engine.info
        key = (info.name, info.revision, reader.layout.version, reader.label_styles, question)
        task = self._measured.get(key)
        if task is None or (task.done() and task.exception() is not None):  # a failed measurement is retried
            task = self._measured[key] = asyncio.ensure_future(measure_prior(reader, question, self.states))
        return await asyncio.shield(task)  # one caller cancelled does not cancel the others' measurement
