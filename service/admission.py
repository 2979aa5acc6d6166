"""Admission: what a request's reads will cost, and when they may start, tenant by tenant.

A request's cost is the prompt tokens its reads make the engine compute (``service/pricing.py``:
each distinct token once, as the engines count them), which a request count does not capture. Costs
in flight are bounded by ``in_flight_cost``; a request that does not fit waits in its tenant's queue.

**Fair shares.** Each tenant (the API key's, ``service/scopes.py``) has its own queue, bounded by
``tenant_queued_cost``, and the queues are served by start-time fair queueing: a request's start tag
is the later of the service's virtual time and its tenant's last finish tag, its finish tag the start
plus its cost over the tenant's ``weight``; the waiting head with the smallest start tag goes next.
So while tenants compete, each gets prompt tokens in proportion to its weight, whatever the others
send. A tenant with nothing in flight starts at once whatever the load (one request per tenant
beyond ``in_flight_cost``; tenants are the key file's): a polite tenant never waits out another's
flood, and the engine takes turns between tenants' reads (``readers/engines/jobs.py``). A tenant's
``tokens_per_minute`` (key file) is a bucket of prompt tokens refilled at that rate, holding a
minute's worth.

**Refusals**, each saying why and when to retry:

- 413 ``request_too_large``: one request over ``request_cost``, or over its tenant's
  ``tokens_per_minute``, or whose own work would take longer than the deadline at a speed the
  service has shown (``CostRate.best_tokens_per_s``); never before such a speed is measured.
- 429 ``rate_limit_error``: the tenant's own queue is full, its expected wait is mostly its own work
  ahead of it, or its token bucket is short (Retry-After: until it refills).
- 529 ``overloaded_error``: the service's queue is full (``queued_cost``), or the expected wait (the
  work the fair queue serves before this request, over the measured rate) passes ``max_wait_s``.

The head of an empty queue may exceed the queue bounds (up to ``request_cost``), and a request alone
may exceed ``in_flight_cost``: every allowed request can run.

**The measured rate** (``CostRate``) comes from work that finished only: while requests are in flight,
each elapsed second is shared between them in proportion to their costs, and a request that completes
adds its cost and its share of time; a request cut part-way (its client left, its deadline passed)
adds neither. Both sums decay with a half-life, so the rate follows a changed load or engine, and the
rate is trusted only once ``min_busy_s`` and ``min_tokens`` of completed work stand behind it.

Every request also has a deadline (``deadline_s``, ``service/cancel.py``): past it, its reads are
cancelled at the next engine call and it gets 504 ``deadline_exceeded``. A waiter whose task is
cancelled leaves the queue, takes nothing, and its tokens go back to its tenant's bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from calibration.store import DEFAULT_TENANT
from service.scopes import EQUAL_SHARE, Share

if TYPE_CHECKING:
    from fastapi import Request

    from readers.reader import Reader

T = TypeVar("T")

INLINE_PRICE_BYTES = 16_384
INLINE_PRICE_ITEMS = 32
"""Bodies up to this size, asking at most this many questions and options in all (choice options,
score levels), are priced on the event loop (``admitted``): about a millisecond. Each question is
prepared once per state and per content-free prior state, each option's labels tried: a 255-option
question takes tens of milliseconds, and so do a hundred score questions in a small body, which
belongs off the loop."""
INLINE_TOKENIZER_WAIT_S = 0.01
"""How long a small request's price waits on the event loop for the tokenizer before it is priced in a
thread instead: longer than a read's prompt holds it (about a millisecond), so a burst of small
requests keeps its arrival order, and far shorter than a long state's hold (half a second)."""


@dataclass(frozen=True)
class AdmissionLimits:
    """Defaults suit the embedded engine on a few CPU cores (a few thousand prompt tokens/s): the queue
    holds roughly ten seconds of work. Raise the costs with the engine's throughput.

    ``tenant_queued_cost``: one tenant's queue at most (429 past it), so one tenant cannot fill the
    service's queue. ``max_wait_s``: a request whose expected wait in the queue is longer is refused
    at once. ``deadline_s``: the longest a request may take from its body read to its answer, queue
    included (504 past it)."""

    in_flight_cost: int = 8_192
    queued_cost: int = 32_768
    request_cost: int = 65_536
    tenant_queued_cost: int = 16_384
    retry_after_s: int = 2
    max_wait_s: float = 10.0
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("in_flight_cost", "queued_cost", "request_cost", "tenant_queued_cost", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_wait_s", "deadline_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


@dataclass(eq=False)
class _InFlight:
    cost: int
    share_s: float = 0.0
    """Seconds of the service's busy time that were this request's (shared by cost)."""


class CostRate:
    """The service's measured speed: prompt tokens per second of busy time, from completed work only.

    While requests are in flight, every elapsed second is shared between them in proportion to their
    costs; a completed request adds its cost and its share to two sums that decay with
    ``half_life_s``. A request cut part-way adds nothing, so an abandoned request cannot make the
    service look slow. ``tokens_per_s`` is None until ``min_busy_s`` and ``min_tokens`` of completed
    work are measured (one small request's overheads are not a speed). ``best_tokens_per_s``: the
    fastest of the last ``recent`` measured rates, the speed a request's own work is held against
    (bounded and recent: it falls again when the machine does)."""

    def __init__(
        self,
        *,
        half_life_s: float = 60.0,
        min_busy_s: float = 2.0,
        min_tokens: int = 4_096,
        recent: int = 64,
        clock=time.monotonic,
    ) -> None:
        self.half_life_s = half_life_s
        self.min_busy_s = min_busy_s
        self.min_tokens = min_tokens
        self._clock = clock
        self._last = clock()
        self._in_flight: list[_InFlight] = []
        self._cost = 0.0
        self._busy_s = 0.0
        self._decayed_at = self._last
        self._recent: deque[float] = deque(maxlen=recent)

    def _advance(self) -> None:
        now = self._clock()
        elapsed, self._last = now - self._last, now
        total = sum(entry.cost for entry in self._in_flight)
        for entry in self._in_flight:
            entry.share_s += elapsed * entry.cost / total

    def started(self, cost: int) -> _InFlight:
        self._advance()
        entry = _InFlight(max(cost, 1))
        self._in_flight.append(entry)
        return entry

    def ended(self, entry: _InFlight, *, completed: bool) -> None:
        self._advance()
        self._in_flight.remove(entry)
        if not completed:
            return
        now = self._clock()
        decay = 0.5 ** ((now - self._decayed_at) / self.half_life_s)
        self._decayed_at = now
        self._cost = self._cost * decay + entry.cost
        self._busy_s = self._busy_s * decay + entry.share_s
        rate = self.tokens_per_s
        if rate is not None:
            self._recent.append(rate)

    @property
    def tokens_per_s(self) -> float | None:
        if self._busy_s < self.min_busy_s or self._cost < self.min_tokens:
            return None
        return self._cost / self._busy_s

    @property
    def best_tokens_per_s(self) -> float | None:
        return max(self._recent, default=None)


@dataclass(eq=False)
class _Waiter:
    cost: int
    start_tag: float
    future: asyncio.Future[None]


@dataclass(eq=False)
class TenantQueue:
    """One tenant's place in admission: its work in flight and queued, and its fair-queueing tag."""

    share: Share
    in_flight: int = 0
    queued: int = 0
    finish_tag: float = 0.0
    waiters: deque[_Waiter] = field(default_factory=deque)
    tokens: float = 0.0
    """Tokens left in its ``tokens_per_minute`` bucket (refilled on use)."""
    refilled_at: float = 0.0

    @property
    def idle(self) -> bool:
        return not self.in_flight and not self.waiters


class Admission:
    def __init__(self, limits: AdmissionLimits = AdmissionLimits(), *, clock=time.monotonic) -> None:
        self.limits = limits
        self.in_flight = 0
        self.queued = 0
        self.tenants: dict[str, TenantQueue] = {}
        self._virtual_time = 0.0
        self._clock = clock
        self.rate = CostRate(clock=clock)

    def _tenant(self, tenant: str, share: Share) -> TenantQueue:
        queue = self.tenants.get(tenant)
        if queue is None:
            per_minute = share.tokens_per_minute
            queue = self.tenants[tenant] = TenantQueue(
                share, tokens=float(per_minute or 0), refilled_at=self._clock()
            )
        elif queue.share != share:  # the key file was reloaded with a new share
            if queue.share.tokens_per_minute is None:  # a new bucket starts full
                queue.tokens, queue.refilled_at = float(share.tokens_per_minute or 0), self._clock()
            queue.share = share
        return queue

    def _forget_if_idle(self, tenant: str) -> None:
        # Idle tenants hold nothing worth keeping but a bucket, which is full again after a minute.
        queue = self.tenants.get(tenant)
        if queue is not None and queue.idle:
            per_minute = queue.share.tokens_per_minute
            if per_minute is None or self._refill(queue) >= per_minute:
                del self.tenants[tenant]

    def expected_wait_s(self, tenant: str | None = None, cost: int = 0) -> float | None:
        """Seconds until a request of ``tenant`` costing ``cost`` queued now would start: the work in
        flight, its tenant's queue, and what the fair queue serves of every other tenant's queue
        meanwhile (in proportion to the weights), at the measured rate. None: not measured."""
        rate = self.rate.tokens_per_s
        if rate is None:
            return None
        return self._work_ahead(tenant, cost) / rate

    def _work_ahead(self, tenant: str | None, cost: int) -> float:
        own = self.tenants.get(tenant) if tenant is not None else None
        if own is None:
            return self.in_flight + self.queued
        mine = own.queued + cost
        others = sum(
            min(queue.queued, mine * queue.share.weight / own.share.weight)
            for name, queue in self.tenants.items()
            if name != tenant
        )
        return self.in_flight + own.queued + others

    def refuse_if_full(self, tenant: str) -> None:
        """429/529 at once, before the request is read or priced, where its tenant's queue or the
        service's is already full: a flood costs the service no work. A tenant with nothing in
        flight is never refused here (it starts at once)."""
        queue = self.tenants.get(tenant)
        if queue is None or not queue.in_flight or not self.queued:
            return
        refusal = self._queue_refusal(queue, tenant, 0)
        if refusal is not None:
            raise refusal

    def _queue_refusal(self, queue: TenantQueue, tenant: str, cost: int):
        """Why a request of ``cost`` may not join ``tenant``'s queue, or None."""
        limits = self.limits
        if queue.waiters and queue.queued + max(cost, 1) > limits.tenant_queued_cost:
            return self._tenant_busy(queue, tenant, "its queue is full", cost)
        # The head of an empty queue is let in whatever its cost (request_cost bounds it): otherwise a
        # request over queued_cost could run only on an idle service, never while anything runs.
        if self.queued and self.queued + max(cost, 1) > limits.queued_cost:
            return self._overloaded(tenant, cost)
        wait = self.expected_wait_s(tenant, cost)
        if wait is None or wait <= limits.max_wait_s:
            return None
        # Behind more of its own work than its weight's part of the work ahead: it is the one to slow down.
        active = [other for other in self.tenants.values() if not other.idle or other is queue]
        part = queue.share.weight / sum(other.share.weight for other in active)
        if queue.in_flight + queue.queued > part * self._work_ahead(tenant, cost):
            return self._tenant_busy(queue, tenant, f"expected wait {wait:.1f} s, behind its own work", cost)
        return self._overloaded(tenant, cost)

    def _overloaded(self, tenant: str | None, cost: int = 0):
        from service.errors import Overloaded

        limits = self.limits
        wait = self.expected_wait_s(tenant, cost)
        expected = "" if wait is None else f", expected wait {wait:.1f} s (at most {limits.max_wait_s:g} s)"
        return Overloaded(
            f"the service is at capacity ({self.in_flight} prompt tokens in flight, {self.queued} queued, "
            f"queue limit {limits.queued_cost}{expected}); retry after {limits.retry_after_s} s",
            retry_after_s=limits.retry_after_s,
        )

    def _tenant_busy(self, queue: TenantQueue, tenant: str, why: str, cost: int = 0):
        """429 where other tenants have work (this one is over its share of a shared service), else
        529: with no one else to serve, it is the service that is at capacity."""
        if not any(other is not queue and not other.idle for other in self.tenants.values()):
            return self._overloaded(tenant, cost)
        return self._over_share(queue, why)

    def _over_share(self, queue: TenantQueue, why: str, retry_after_s: float | None = None):
        from service.errors import TenantLimited

        limits = self.limits
        retry = max(1, math.ceil(retry_after_s)) if retry_after_s is not None else limits.retry_after_s
        return TenantLimited(
            f"this tenant's work is at its share: {why} ({queue.in_flight} prompt tokens in flight, "
            f"{queue.queued} queued, tenant queue limit {limits.tenant_queued_cost}); other tenants are "
            f"served meanwhile; retry after {retry} s",
            retry_after_s=retry,
        )

    def _refill(self, queue: TenantQueue) -> float:
        per_minute = queue.share.tokens_per_minute
        if per_minute is None:
            return math.inf
        now = self._clock()
        queue.tokens = min(per_minute, queue.tokens + (now - queue.refilled_at) * per_minute / 60)
        queue.refilled_at = now
        return queue.tokens

    def _check(self, cost: int, tenant: str, queue: TenantQueue) -> None:
        """The refusals that do not depend on the queue: 413 for work that can never be allowed or
        never end in time, 429 for a tenant's token bucket."""
        from service.errors import RequestTooCostly

        limits = self.limits
        if cost > limits.request_cost:
            raise RequestTooCostly(
                f"this request schedules {cost} prompt tokens over its reads (each distinct prompt token once: "
                f"states, questions, option names, content-free prior reads); one request may cost at most "
                f"{limits.request_cost}: send fewer questions or a shorter state",
                param="body",
            )
        per_minute = queue.share.tokens_per_minute
        if per_minute is not None and cost > per_minute:
            raise RequestTooCostly(
                f"this request schedules {cost} prompt tokens; this tenant may schedule at most {per_minute} "
                "a minute (its key's tokens_per_minute): send fewer questions or a shorter state",
                param="body",
            )
        # Held against the fastest recent speed the service has shown, so only work that could not end
        # in time at its best is refused here; work that would at its best, but not under load, may get 504.
        rate = self.rate.best_tokens_per_s
        if rate is not None and cost / rate > limits.deadline_s:
            raise RequestTooCostly(
                f"this request schedules {cost} prompt tokens over its reads: {cost / rate:.0f} s of work at "
                f"the fastest recently measured {rate:.0f} prompt tokens/s, past the {limits.deadline_s:g} s "
                "deadline (decide serve --deadline): send fewer questions or a shorter state",
                param="body",
            )
        if self._refill(queue) < cost:
            short = cost - queue.tokens
            raise self._over_share(
                queue,
                f"its tokens_per_minute ({per_minute}) has {queue.tokens:.0f} tokens left for this request's {cost}",
                retry_after_s=short * 60 / per_minute,
            )

    @contextlib.asynccontextmanager
    async def admit(
        self, cost: int, tenant: str = DEFAULT_TENANT, share: Share = EQUAL_SHARE
    ) -> AsyncIterator[None]:
        """Hold ``cost`` for the block; wait in ``tenant``'s queue if needed, or raise 413/429/529."""
        queue = self._tenant(tenant, share)
        try:
            self._check(cost, tenant, queue)
        except BaseException:
            self._forget_if_idle(tenant)
            raise
        if queue.share.tokens_per_minute is not None:
            queue.tokens -= cost
        start_tag, earlier_finish = max(self._virtual_time, queue.finish_tag), queue.finish_tag
        queue.finish_tag = finish_tag = start_tag + cost / queue.share.weight
        # A tenant with nothing in flight starts at once; others join the fair queue behind anyone waiting.
        if self._fits(cost, queue) and (not queue.in_flight or not self.queued):
            self._take(cost, queue, start_tag)
        else:
            try:
                await self._wait(cost, tenant, queue, start_tag)
            except BaseException:  # refused, or cancelled before it started: nothing was computed for it
                if queue.share.tokens_per_minute is not None:
                    queue.tokens += cost
                if queue.finish_tag == finish_tag:  # no later request was tagged after it
                    queue.finish_tag = earlier_finish
                self._forget_if_idle(tenant)
                raise
        entry = self.rate.started(cost)
        completed = False
        try:
            yield
            completed = True
        finally:
            self.rate.ended(entry, completed=completed)
            self.in_flight -= cost
            queue.in_flight -= cost
            self._wake()
            self._forget_if_idle(tenant)

    async def _wait(self, cost: int, tenant: str, queue: TenantQueue, start_tag: float) -> None:
        refusal = self._queue_refusal(queue, tenant, cost)
        if refusal is not None:
            raise refusal
        waiter = _Waiter(cost, start_tag, asyncio.get_running_loop().create_future())
        queue.waiters.append(waiter)
        queue.queued += cost
        self.queued += cost
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():  # granted as it was cancelled
                self.in_flight -= cost
                queue.in_flight -= cost
            else:
                queue.waiters.remove(waiter)
                queue.queued -= cost
                self.queued -= cost
            self._wake()
            raise

    def _fits(self, cost: int, queue: TenantQueue) -> bool:
        return (
            not queue.in_flight or not self.in_flight or self.in_flight + cost <= self.limits.in_flight_cost
        )

    def _take(self, cost: int, queue: TenantQueue, start_tag: float) -> None:
        self._virtual_time = max(self._virtual_time, start_tag)
        self.in_flight += cost
        queue.in_flight += cost

    def _wake(self) -> None:
        # The waiting head with the smallest start tag goes next, once it fits; a head that does not
        # fit holds the others back (so a large request is not starved by small ones behind it),
        # except heads of tenants with nothing in flight, which always fit.
        while True:
            heads = [queue for queue in self.tenants.values() if queue.waiters]
            if not heads:
                return
            queue = min(heads, key=lambda q: q.waiters[0].start_tag)
            waiter = queue.waiters[0]
            if not self._fits(waiter.cost, queue):
                idle = [q for q in heads if not q.in_flight]
                if not idle:
                    return
                queue = min(idle, key=lambda q: q.waiters[0].start_tag)
                waiter = queue.waiters[0]
            queue.waiters.popleft()
            queue.queued -= waiter.cost
            self.queued -= waiter.cost
            self._take(waiter.cost, queue, waiter.start_tag)
            waiter.future.set_result(None)


def priced_inline(body_bytes: int, jobs: list[tuple[Callable[[], list[str]], dict[str, Any], tuple]]) -> bool:
    """Whether a request is priced on the event loop (``INLINE_PRICE_BYTES``, ``INLINE_PRICE_ITEMS``)."""
    items = sum(
        1 + (len(question.criteria) if question.type in ("choice", "score") else 0)
        for _, questions, _ in jobs
        for question in questions.values()
    )
    return body_bytes <= INLINE_PRICE_BYTES and items <= INLINE_PRICE_ITEMS


async def admitted(
    request: Request,
    reader: Reader,
    jobs: list[tuple[Callable[[], list[str]], dict[str, Any], tuple]],
    work: Callable[[], Awaitable[T]],
) -> T:
    """Run ``work()`` once the cost of its reads is admitted for the request's tenant. ``reader``: the
    caller's (``Reader.for_tenant``), so the price counts what that tenant's own reads hold (option
    priors, image sizes) and nothing another tenant's do. ``jobs``:
    (what renders the states, wire questions asked of each, their body location); the states are
    rendered where the price is made, off the event loop for a large body (a 14 MB JSON state takes
    ~150 ms to render). Option names over their token bound
    get 422 first, and a question or state that cannot be read its own error, before any work."""
    from service.pipeline.reads import to_read
    from service.pricing import check_option_tokens, distinct_tokens, planned_reads
    from service.scopes import ANONYMOUS

    caller = request.scope.get("state", {}).get("caller", ANONYMOUS)
    admission = request.app.state.admission
    admission.refuse_if_full(caller.tenant)
    priors = request.app.state.priors

    def price() -> int:
        reads = []
        for states, questions, loc in jobs:
            check_option_tokens(reader, questions, loc)
            plans = [to_read(question, (*loc, "questions", name)) for name, question in questions.items()]
            reads += planned_reads(reader, plans, states(), priors)
        return distinct_tokens(reader, reads)

    # A small request is priced on the event loop, in about a millisecond: with no thread hop in
    # between, pricing and the admission decision happen at once, so a burst of small requests is
    # admitted or refused in arrival order without waiting for threads. A large one is priced off the
    # loop, and so is one that finds the tokenizer held past INLINE_TOKENIZER_WAIT_S (a worker in
    # another request's long state): the loop waits out a read's short hold, never a long one.
    cost = None
    if priced_inline(len(await request.body()), jobs):
        with reader.template.held_within(INLINE_TOKENIZER_WAIT_S) as held:
            cost = price() if held else None
    if cost is None:
        cost = await asyncio.to_thread(price)
    async with admission.admit(cost, caller.tenant, caller.share):
        return await work()
