"""Admission: a bounded, cost-weighted semaphore around a request's reads.

A request's cost is its prompt tokens summed over its reads (state + question, per question): what
the engine must process, which a request count does not capture (one 7,000-token state with 4
questions costs as much as ~200 short one-question requests). Costs in flight are bounded by
``in_flight_cost``; a request that does not fit waits in a FIFO queue bounded by ``queued_cost``;
a request that does not fit the queue either gets 529 ``overloaded_error`` with Retry-After at once,
so a flood is refused in milliseconds instead of every caller waiting. A single request over
``request_cost`` gets 413 naming the limit. A request alone may exceed ``in_flight_cost`` (up to
``request_cost``): it runs when nothing else is in flight, so no allowed request waits forever.

A waiter whose task is cancelled (its client disconnected) leaves the queue and takes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from readers.prompt import QuestionSpec
from readers.reader import Reader


@dataclass(frozen=True)
class AdmissionLimits:
    """Defaults suit the embedded engine on a few CPU cores (a few thousand prompt tokens/s): the queue
    holds roughly ten seconds of work. Raise them with the engine's throughput."""

    in_flight_cost: int = 8_192
    queued_cost: int = 32_768
    request_cost: int = 65_536
    retry_after_s: int = 2

    def __post_init__(self) -> None:
        for name in ("in_flight_cost", "queued_cost", "request_cost", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class Admission:
    def __init__(self, limits: AdmissionLimits = AdmissionLimits()) -> None:
        self.limits = limits
        self.in_flight = 0
        self.queued = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.asynccontextmanager
    async def admit(self, cost: int) -> AsyncIterator[None]:
        """Hold ``cost`` for the block; wait in the queue if needed, or raise 413/529."""
        # Imported here: ``decide serve --help`` reads AdmissionLimits' defaults without the web framework
        # service.errors builds responses with.
        from service.errors import Overloaded, RequestTooCostly

        limits = self.limits
        if cost > limits.request_cost:
            raise RequestTooCostly(
                f"this request costs {cost} prompt tokens over its reads (tokens × questions); one request may cost at most "
                f"{limits.request_cost}: send fewer questions or a shorter state",
                param="body",
            )
        if not self._waiters and self._fits(cost):
            self.in_flight += cost
        else:
            if self.queued + cost > limits.queued_cost:
                raise Overloaded(
                    f"the service is at capacity ({self.in_flight} prompt tokens in flight, {self.queued} queued, "
                    f"queue limit {limits.queued_cost}); retry after {limits.retry_after_s} s",
                    retry_after_s=limits.retry_after_s,
                )
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
        try:
            yield
        finally:
            self._release(cost)

    def _fits(self, cost: int) -> bool:
        return self.in_flight == 0 or self.in_flight + cost <= self.limits.in_flight_cost

    def _release(self, cost: int) -> None:
        self.in_flight -= cost
        self._wake()

    def _wake(self) -> None:
        # FIFO: the head waits until it fits, so a large request is not starved by small ones behind it.
        while self._waiters and self._fits(self._waiters[0][0]):
            cost, waiter = self._waiters.popleft()
            self.queued -= cost
            self.in_flight += cost
            waiter.set_result(None)


def request_cost(reader: Reader, states: list[str], questions: list[QuestionSpec]) -> int | None:
    """Prompt tokens over every read: Σ over states and questions of (state tokens + question tokens
    + option tokens).

    Option names count twice, as the engine computes them: once listed in the question, once more
    as the answer slot's token-trie reads (a read per trie node). Counted with the served tokenizer, without the chat template's few fixed
    tokens. None when some state cannot fit the context whatever its tokens (the reader then refuses
    it with 413 without tokenizing, so there is nothing to admit)."""
    template = (
        reader.template
    )  # its caller-text encoder: locked, and special-token text stays text as in the read
    longest = template.max_token_chars
    if any(len(state) // longest >= reader.engine.info.context_length for state in states):
        return None
    question_tokens = sum(
        len(template.encode_text(_question_text(spec)))
        + sum(len(template.encode_text(" " + option)) for option in spec.options)
        for spec in questions
    )
    state_tokens = sum(len(template.encode_text(state)) for state in states)
    return state_tokens * len(questions) + question_tokens * len(states)


def _question_text(spec: QuestionSpec) -> str:
    parts = [spec.instructions or "", *spec.options, *(text or "" for text in spec.descriptions)]
    return "\n".join(parts)
