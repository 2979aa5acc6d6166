"""Admission: a bounded, cost-weighted semaphore around a request's reads, and each request's bounds.

A request's cost is the prompt tokens its reads make the engine compute (``request_cost``), which a
request count does not capture (one 7,000-token state with 4 questions costs as much as ~100 short
one-question requests). A state read with many questions is computed once (the shared-state path:
the embedded engine computes each distinct token once, vLLM's prefix cache nearly so), so it is priced
once per state, and each question by its own tokens. Costs in flight are bounded by
``in_flight_cost``; a request that does not fit waits in a FIFO queue bounded twice: by
``queued_cost``, and by its expected wait, the work ahead of it (in flight and queued before it) over
the service's measured rate (prompt tokens per busy second, ``CostRate``), at most ``max_wait_s``. A
request that does not fit the queue gets 529 ``overloaded_error`` with Retry-After; ``refuse_if_full``
says so before the request is even priced, so a flood is refused in milliseconds with no work done
for it. The head of an empty queue may exceed ``queued_cost`` (up to ``request_cost``), and a request
alone may exceed ``in_flight_cost``: it runs when nothing else is in flight, so every allowed request
can run. A single request over ``request_cost``, or whose own work would take longer than the
deadline even at the fastest rate measured, gets 413 naming its work and the limit: up front, not a
504 after a minute.

Every request also has a deadline (``deadline_s``, ``service/cancel.py``): past it, its reads are
cancelled at the next engine call and it gets 504 ``deadline_exceeded``.

A waiter whose task is cancelled (its client disconnected, its deadline passed) leaves the queue and
takes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from readers.prompt import QuestionSpec
from readers.reader import Reader

if TYPE_CHECKING:
    from fastapi import Request

    from service.pipeline.prior import OptionPriors

T = TypeVar("T")

INLINE_PRICE_BYTES = 16_384
"""Bodies up to this size are priced on the event loop (``admitted``)."""

MAX_OPTION_NAME_TOKENS = 32
"""Tokens in one option name at most: a name is read token by token (one engine call per depth of the
options' token trie, and again on each content-free state the first time a question is seen), so its
tokens bound a request's sequential engine calls. Characters are bounded in the wire model
(``service.protocol.questions.MAX_OPTION_NAME_CHARS``)."""


@dataclass(frozen=True)
class AdmissionLimits:
    """Defaults suit the embedded engine on a few CPU cores (a few thousand prompt tokens/s): the queue
    holds roughly ten seconds of work. Raise the costs with the engine's throughput.

    ``max_wait_s``: a request whose expected wait in the queue (the cost ahead of it at the measured
    rate) is longer gets 529 at once. ``deadline_s``: the longest a request may take from its body read
    to its answer, queue included (504 past it)."""

    in_flight_cost: int = 8_192
    queued_cost: int = 32_768
    request_cost: int = 65_536
    retry_after_s: int = 2
    max_wait_s: float = 10.0
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("in_flight_cost", "queued_cost", "request_cost", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_wait_s", "deadline_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


class CostRate:
    """The service's measured rate: prompt tokens of completed requests per second the engine was busy
    (something in flight), both decayed with a ``half_life_s``, so it follows a changed load or engine.
    None until ``min_busy_s`` of busy time is measured: a cold service bounds its queue by size only.
    ``peak_tokens_per_s``: the fastest it has been measured at, which a request's own work is held
    against (a rate measured while the model warms up, or under a burst, would refuse work that runs)."""

    def __init__(self, *, half_life_s: float = 60.0, min_busy_s: float = 2.0, clock=time.monotonic) -> None:
        self.half_life_s = half_life_s
        self.min_busy_s = min_busy_s
        self._clock = clock
        self._cost = 0.0
        self._busy_s = 0.0
        self._last = clock()
        self.peak_tokens_per_s: float | None = None

    def advance(self, busy: bool) -> None:
        """Account the time since the last event, busy or idle; call before ``in_flight`` changes."""
        now = self._clock()
        elapsed = now - self._last
        self._last = now
        decay = 0.5 ** (elapsed / self.half_life_s)
        self._cost *= decay
        self._busy_s = self._busy_s * decay + (elapsed if busy else 0.0)

    def completed(self, cost: int) -> None:
        self._cost += cost
        rate = self.tokens_per_s
        if rate is not None and (self.peak_tokens_per_s is None or rate > self.peak_tokens_per_s):
            self.peak_tokens_per_s = rate

    @property
    def tokens_per_s(self) -> float | None:
        if self._busy_s < self.min_busy_s or self._cost <= 0:
            return None
        return self._cost / self._busy_s


class Admission:
    def __init__(self, limits: AdmissionLimits = AdmissionLimits()) -> None:
        self.limits = limits
        self.in_flight = 0
        self.queued = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.rate = CostRate()

    def expected_wait_s(self) -> float | None:
        """Seconds until a request queued now would start: the work in flight and queued ahead of it at
        the measured rate (None: not measured). Its own work is not its wait."""
        rate = self.rate.tokens_per_s
        return None if rate is None else (self.in_flight + self.queued) / rate

    def refuse_if_full(self) -> None:
        """529 at once, before the request is read or priced, where the queue is already full (by cost or
        by expected wait): a flood costs the service no work."""
        if self._waiters and (
            self.queued >= self.limits.queued_cost or (self.expected_wait_s() or 0.0) > self.limits.max_wait_s
        ):
            raise self._overloaded()

    def _overloaded(self):
        from service.errors import Overloaded

        limits = self.limits
        wait = self.expected_wait_s()
        expected = "" if wait is None else f", expected wait {wait:.1f} s (at most {limits.max_wait_s:g} s)"
        return Overloaded(
            f"the service is at capacity ({self.in_flight} prompt tokens in flight, {self.queued} queued, "
            f"queue limit {limits.queued_cost}{expected}); retry after {limits.retry_after_s} s",
            retry_after_s=limits.retry_after_s,
        )

    @contextlib.asynccontextmanager
    async def admit(self, cost: int) -> AsyncIterator[None]:
        """Hold ``cost`` for the block; wait in the queue if needed, or raise 413/529."""
        # Imported here: ``decide serve --help`` reads AdmissionLimits' defaults without the web framework
        # service.errors builds responses with.
        from service.errors import RequestTooCostly

        limits = self.limits
        if cost > limits.request_cost:
            raise RequestTooCostly(
                f"this request schedules {cost} prompt tokens over its reads (each state once, each question "
                f"and its option names per state, content-free prior reads); one request may cost at most "
                f"{limits.request_cost}: send fewer questions or a shorter state",
                param="body",
            )
        # Held against the fastest rate measured, so only work that could not end in time at the
        # service's best is refused here; work that would at its best, but not under load, may get 504.
        rate = self.rate.peak_tokens_per_s
        if rate is not None and cost / rate > limits.deadline_s:
            raise RequestTooCostly(
                f"this request schedules {cost} prompt tokens over its reads: {cost / rate:.0f} s of work at "
                f"the fastest measured {rate:.0f} prompt tokens/s, past the {limits.deadline_s:g} s deadline "
                "(decide serve --deadline): send fewer questions or a shorter state",
                param="body",
            )
        if not self._waiters and self._fits(cost):
            self._take(cost)
        else:
            wait = self.expected_wait_s()
            # The head of an empty queue is let in whatever its cost (request_cost bounds it): otherwise
            # a request over queued_cost could run only on an idle service, never while anything runs.
            over_queue = bool(self._waiters) and self.queued + cost > limits.queued_cost
            if over_queue or (wait is not None and wait > limits.max_wait_s):
                raise self._overloaded()
            waiter = asyncio.get_running_loop().create_future()
            entry = (cost, waiter)
            self._waiters.append(entry)
            self.queued += cost
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # granted just as it was cancelled: give it back
                    self._release(cost)
                else:
                    self._waiters.remove(entry)
                    self.queued -= cost
                    self._wake()
                raise
        completed = False
        try:
            yield
            completed = True
        finally:
            self._release(cost, completed=completed)

    def _fits(self, cost: int) -> bool:
        return self.in_flight == 0 or self.in_flight + cost <= self.limits.in_flight_cost

    def _take(self, cost: int) -> None:
        self.rate.advance(busy=self.in_flight > 0)
        self.in_flight += cost

    def _release(self, cost: int, *, completed: bool = False) -> None:
        # Only work done counts toward the rate: a request stopped half-way did not cost its whole price.
        self.rate.advance(busy=True)
        if completed:
            self.rate.completed(cost)
        self.in_flight -= cost
        self._wake()

    def _wake(self) -> None:
        # FIFO: the head waits until it fits, so a large request is not starved by small ones behind it.
        while self._waiters and self._fits(self._waiters[0][0]):
            cost, waiter = self._waiters.popleft()
            self.queued -= cost
            self._take(cost)
            waiter.set_result(None)


def request_cost(reader: Reader, states: list[str], questions: list[QuestionSpec]) -> int | None:
    """Prompt tokens the reads of ``questions`` about each of ``states`` make the engine compute:
    Σ over states of (state tokens + Σ over questions of (question tokens + option tokens)).

    A state is computed once however many questions read it (issue 25's shared-state path: the
    reads share the state's prefix, and the local engine computes each distinct token once, vLLM's
    prefix cache nearly so), so it is priced once; pricing it per question made 400 questions about
    one short input cost ~6× their work, over the default limits. Option names count twice, as the
    engine computes them: once listed in the question, once more as the answer slot's token-trie reads
    (each trie node's token once). Counted with the served tokenizer, without the chat template's few
    fixed tokens. None when some state cannot fit the context whatever its tokens (the reader then
    refuses it with 413 without tokenizing, so there is nothing to admit)."""
    template = (
        reader.template
    )  # its caller-text encoder: locked, and special-token text stays text as in the read
    longest = template.max_token_chars
    if any(len(state) // longest >= reader.engine.info.context_length for state in states):
        return None
    question_tokens = sum(_question_tokens(reader, spec) for spec in questions)
    state_tokens = sum(len(template.encode_text(state)) for state in states)
    return state_tokens + question_tokens * len(states)


def _question_tokens(reader: Reader, spec: QuestionSpec) -> int:
    encode = reader.template.encode_text
    return len(encode(_question_text(spec))) + sum(len(encode(" " + option)) for option in spec.options)


def prior_cost(reader: Reader, priors: OptionPriors | None, questions: list[QuestionSpec]) -> int:
    """Prompt tokens of the content-free prior reads the first request for a question schedules: one
    read per content-free state for each distinct question ``priors`` covers and holds no prior for."""
    if priors is None:
        return 0
    from calibration.bias import CONTENT_FREE_STATES

    states = priors.states if priors.states is not None else CONTENT_FREE_STATES
    state_tokens = sum(len(reader.template.encode_text(state)) for state in states)
    unmeasured = {
        spec for spec in questions if priors.policy.covers(spec.question_type) and spec not in priors
    }
    return sum(state_tokens + len(states) * _question_tokens(reader, spec) for spec in unmeasured)


def check_option_tokens(reader: Reader, questions: dict[str, Any], loc: tuple = ("body",)) -> None:
    """422 naming the option whose name is over ``MAX_OPTION_NAME_TOKENS`` tokens."""
    from service.errors import validation_error

    encode = reader.template.encode_text
    for name, question in questions.items():
        if question.type != "choice":  # yes/no and score levels are the service's own labels
            continue
        for option in question.criteria:
            tokens = len(encode(" " + option))
            if tokens > MAX_OPTION_NAME_TOKENS:
                raise validation_error(
                    (*loc, "questions", name, "choice", "criteria", option[:40]),
                    f"option name has {tokens} tokens; at most {MAX_OPTION_NAME_TOKENS} (each is one sequential engine read)",
                    "option_name_too_long",
                )


def _question_text(spec: QuestionSpec) -> str:
    parts = [spec.instructions or "", *spec.options, *(text or "" for text in spec.descriptions)]
    return "\n".join(parts)


async def admitted(
    request: Request,
    reader: Reader,
    jobs: list[tuple[list[str], dict[str, Any], tuple]],
    work: Callable[[], Awaitable[T]],
) -> T:
    """Run ``work()`` once the cost of its reads is admitted. ``jobs``: (states, wire questions asked of
    each, their body location). Option names over their token bound get 422 first; a request some of
    whose states cannot fit the context skips admission (the reader refuses it without tokenizing)."""
    from service.pipeline.reads import to_read

    admission = request.app.state.admission
    admission.refuse_if_full()
    priors = request.app.state.priors

    def price() -> int | None:
        total, as_asked = 0, []
        for states, questions, loc in jobs:
            check_option_tokens(reader, questions, loc)
            plans = [to_read(question) for question in questions.values()]
            # Priced by the reads the pipeline makes: a rotated question (x_debias) once per rotation,
            # and the served prior only for reads as asked (rotated reads are not prior-corrected).
            cost = request_cost(reader, states, [spec for plan in plans for spec in plan.engine_reads()])
            if cost is None:
                return None
            total += cost
            as_asked += [plan.spec for plan in plans if plan.rotations == 1]
        return total + prior_cost(reader, priors, as_asked)

    # A small request is priced on the event loop, in well under a millisecond: with no thread hop in
    # between, pricing and the admission decision happen at once, so a burst of small requests is
    # admitted or refused in arrival order without waiting for threads (a flood's 529 took up to 3 s
    # behind the thread pool). A large one is tokenized off the loop.
    small = len(await request.body()) <= INLINE_PRICE_BYTES
    cost = price() if small else await asyncio.to_thread(price)
    if cost is None:
        return await work()
    async with admission.admit(cost):
        return await work()
