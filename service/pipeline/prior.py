"""The content-free prior correction, served: each question's option prior, measured once and cached.

A question's prior is what the model answers it with on content-free states
(``calibration.bias.CONTENT_FREE_STATES``), read through the same reader, so the same prompt layout,
as real reads. It depends on the model, its revision, the prompt version and the question itself
(instructions, options, descriptions), which together are the cache key; a new prompt version (a
restart with new code) or another model measures afresh. Nothing is stored: the measurement costs
one read per content-free state, once per question per process.

Which questions get it is the service's ``PriorCorrection`` policy, chosen per question type on
development records (never the test samples; docs/reads.md, evidence/reads/dev-reads/): the default,
``choice+score``, corrects choice and score questions and leaves yes/no questions raw. A choice
question's options and a score's level names are words the caller picked, and how readily a model
writes one ("Sports" against "Sci/Tech", "positive" against "neutral") says nothing about the state:
on the dev records the correction lifted the embedded model's AG News reads 46.5 → 64.0%, SST-2 63.0
→ 67.5% (emotion 46.0 → 45.0%), and its three-level sentiment scores 42.5 → 53.0% (five levels 26.5 →
28.5%); a yes/no question always reads "Yes" against "No", and there dividing the model's lean out
cost irony 60.5 → 46.0%.

Applied (``decide.py``) before any stored calibration: a fit for a question the policy covers is
made on corrected reads and applied after the correction (its key's version is marked ``+prior``,
``read_version``), so the two stack, and a fit made under the other policy is kept but not applied.
Not applied (``served_prior``) to reads averaged over option rotations (their position bias is
already averaged out; a prior read in one order would put it back), nor to top-k reads where a label
fell below the returned tokens: its probability there comes from that read's floor, and dividing by a
prior whose floor was another read's could crown a label no read returned. For the same reason the
prior itself is measured only from content-free reads that returned every label; a question with none
is answered raw. Such answers report ``prior_correction`` null and use fits made on raw reads.

A measurement that fails on an engine fault fails the request, as the read would (502/503/504), and
is measured afresh by the next one. Concurrent callers share one measurement, which outlives any one
of them that leaves; when the last one leaves (its client disconnected, its deadline passed) it is
cancelled, since its reads were priced into the admission of the callers waiting for it, and without
one they would run on outside admission. The next request measures afresh.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opendecide.tenant_cache import TenantCache
from readers.prompt import QuestionSpec

if TYPE_CHECKING:
    from readers.reader import Reader, Reading


class PriorCorrection(enum.StrEnum):
    """Which question types' reads get the content-free prior correction: none, every one, or the
    types named (joined by ``+``), each type chosen on development records (docs/reads.md)."""

    OFF = "off"
    NOUL = "noul"
    CHOICE = "choice"  # choice questions: options named by the caller
    SCORE = "score"
    NOUL_CHOICE = "noul+choice"
    NOUL_SCORE = "noul+score"
    CHOICE_SCORE = "choice+score"
    ALL = "all"  # every question: choice, yes/no and score

    def covers(self, question_type: str) -> bool:
        return self is PriorCorrection.ALL or question_type in self.value.split("+")

    @classmethod
    def of_types(cls, question_types: Iterable[str]) -> PriorCorrection:
        """The policy that covers exactly ``question_types``."""
        named = [t for t in ("noul", "choice", "score") if t in set(question_types)]
        if len(named) == 3:
            return cls.ALL
        return cls("+".join(named) or "off")


DEFAULT_PRIOR_CORRECTION = PriorCorrection.CHOICE_SCORE
PRIOR_MARK = "+prior"
MAX_PRIORS = 4096
"""Questions whose priors a process keeps: callers choose the questions, so the cache is bounded like
every other per-caller structure; past it, the cache salt (tenant or cache group) holding the most
gives back its least recently used (``opendecide.tenant_cache``)."""


def read_version(prompt_version: str, corrected: bool) -> str:
    """The version a stored calibration is keyed by: the prompt layout, marked ``+prior`` where the
    reads it is fitted on and applied to have the prior divided out. A fit on corrected reads is
    applied after the correction, and a fit on raw reads only to raw reads: like a fit made under
    another layout, one made under the other policy stays stored but does not apply."""
    return prompt_version + PRIOR_MARK if corrected else prompt_version


@dataclass(frozen=True)
class OptionPrior:
    """A question's measured prior, in option order, and what it was measured on."""

    prior: tuple[float, ...]
    states: tuple[str, ...]
    prompt_version: str


async def measure_prior(
    reader: Reader, question: QuestionSpec, states: tuple[str, ...] | None = None
) -> OptionPrior | None:
    """Read ``question`` on each content-free state (default ``CONTENT_FREE_STATES``), at once; the
    prior is the mean of the reads that returned every label. None when none did: there is nothing
    sound to divide out."""
    # Imported here: the command line imports this module for PriorCorrection, scipy only loads to measure.
    from calibration.bias import CONTENT_FREE_STATES, option_prior

    states = CONTENT_FREE_STATES if states is None else states
    # Read once per question: the engine need not keep these prompts (ReadRequest.keep).
    readings = await asyncio.gather(*(reader.read(question, state, keep=False) for state in states))
    # Every label returned: a floored label's value is that read's floor, not the model's prior.
    used = [
        (state, r.label_probabilities.probabilities)
        for state, r in zip(states, readings)
        if r.label_probabilities.exact
    ]
    if not used:
        return None
    try:
        prior = option_prior([probabilities for _, probabilities in used])
    except ValueError:  # an option's probability underflowed to 0 on every state: nothing finite to divide by
        return None
    return OptionPrior(
        tuple(float(q) for q in prior), tuple(state for state, _ in used), reader.layout.version
    )


async def served_prior(priors: OptionPriors | None, reader: Reader, reading: Reading) -> OptionPrior | None:
    """The prior to divide out of ``reading`` as the service answers it, or None (module docstring:
    a policy not covering the question, an uninformative, rotated or floor-bounded read, no prior)."""
    from readers.debias import RotatedReading

    read = reading.label_probabilities
    if priors is None or not read.exact or isinstance(reading, RotatedReading):
        return None
    return await priors.prior(reader, reading.question)


class OptionPriors:
    """Per-process cache of measured priors, keyed by (model, revision, prompt version, label
    styles, the reader's cache salt, question), for the questions ``policy`` covers: each tenant (or
    cache group) measures its own, so no caller learns from its latency which questions another asked.

    Concurrent first requests for one question share one measurement; one that failed (an engine
    fault) is measured again by the next request. At most ``limit`` questions are kept, and past it
    the cache salt holding the most gives back first: a tenant sending ever-new questions evicts its
    own priors, never those of a tenant asking fewer, whose answers would otherwise wait on three
    reads again. ``states``: the content-free states (default ``calibration.bias.CONTENT_FREE_STATES``).
    """

    def __init__(
        self,
        policy: PriorCorrection = DEFAULT_PRIOR_CORRECTION,
        states: tuple[str, ...] | None = None,
        *,
        limit: int = MAX_PRIORS,
    ) -> None:
        if policy is PriorCorrection.OFF:
            raise ValueError(
                "a prior cache for policy 'off' would never be used: pass no OptionPriors instead"
            )
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.policy = policy
        self.states = states
        self.limit = limit
        self._measured: TenantCache[asyncio.Task[OptionPrior | None]] = TenantCache(limit)
        self._waiting: dict[asyncio.Task[OptionPrior | None], int] = {}  # callers awaiting each measurement

    def __len__(self) -> int:
        return len(self._measured)

    def measuring(self) -> int:
        """Measurements held and still running."""
        return sum(not task.done() for task in self._measured.values())

    def held(self, reader: Reader, question: QuestionSpec) -> bool:
        """Whether ``reader`` would get ``question``'s prior without reading it: measured or being
        measured under the reader's own cache salt (a failed measurement is read again). Pricing asks
        this, so one tenant's price never shows which questions another asked."""
        task = self._measured.peek(reader.cache_salt, self._key(reader, question))
        return task is not None and not (task.done() and (task.cancelled() or task.exception() is not None))

    @staticmethod
    def _key(reader: Reader, question: QuestionSpec) -> tuple:
        # Per cache salt: the reads are the caller's (salted), and a prior measured for another
        # tenant would answer at once, showing that someone asked this question (issue 40).
        info = reader.engine.info
        return (
            info.name,
            info.revision,
            reader.layout.version,
            reader.label_styles,
            reader.cache_salt,
            question,
        )

    async def prior(self, reader: Reader, question: QuestionSpec) -> OptionPrior | None:
        """The question's prior, or None where the policy does not cover it or it cannot be measured."""
        if not self.policy.covers(question.question_type):
            return None
        key = self._key(reader, question)
        task = self._measured.get(reader.cache_salt, key)
        if task is None or (
            task.done() and (task.cancelled() or task.exception() is not None)
        ):  # a failed measurement is retried
            task = asyncio.ensure_future(measure_prior(reader, question, self.states))
            # An evicted one still running finishes for its callers.
            self._measured.put(reader.cache_salt, key, task)
        self._waiting[task] = self._waiting.get(task, 0) + 1
        try:
            return await asyncio.shield(task)  # one caller cancelled does not cancel the others' measurement
        finally:
            self._waiting[task] -= 1
            if not self._waiting[task]:
                del self._waiting[task]
                task.cancel()  # no caller left (a no-op once done): its reads stop, as theirs did
