"""Which running batch the local engine's compute thread steps next (``readers/engines/local.py``,
module docstring, 4), and how long its step may be: tenants take turns, the smallest batch first,
none passed over for long, and a long batch computes in short chunks while another tenant is active.

Pure bookkeeping over ``Running`` batches (their jobs, steps and how their turns went), apart from
the engine so the rule reads in one place and is tested without a model.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from readers.engines.jobs import Job

RUNNING_BATCHES = 2
"""Batches of one tenant the compute thread takes turns between: a batch that arrives while a long one
runs starts at the long one's next chunk; more wait in the queue, in order (a read whose caller leaves
while it is queued costs nothing)."""
MAX_RUNNING_BATCHES = 3
"""Batches running in all: one more than a tenant may hold, so another tenant's batch starts at the
next chunk even while one tenant holds its two; a running batch's working memory is held at most
three times."""
MAX_PASSED_TURNS = 3
"""Chunks of its own tenant's other batches a running batch lets go first, in a row, whatever its size."""
MAX_PASSED_S = 0.5
"""Seconds of other tenants' chunks a tenant's running batches let go first, in a row, before one of them
takes a chunk whatever its size. Seconds, not chunks: a polite tenant's question is two or three short
steps (its chunks, its head), and it should take them in a row rather than let a long batch's chunk in
between each (~0.2 s each on two cores; issue 39: p99 935 ms beside a flood against 119 ms alone when
a count of turns let the long batch in); a long batch still gets a chunk every ~0.5 s however many
short reads arrive."""


@dataclass(eq=False)
class Running:
    """A batch the compute thread takes turns with: its jobs (one tenant's), its steps, its size (the
    prompt tokens of its reads, an upper bound of what it computes) and how its turns went."""

    jobs: list[Job]
    steps: Generator[bool, None, None]
    blocked: bool = False
    """Its last step waited for tokens another batch of its tenant is computing."""
    passed: int = 0
    """Chunks its own tenant's other batches computed since its last one."""
    passed_s: float = 0.0
    """Seconds other tenants' batches computed since its tenant's last chunk."""

    def __post_init__(self) -> None:
        self.size = sum(len(request.prompt_ids) for job in self.jobs for request in job.requests)

    @property
    def tenant(self) -> str | None:
        return self.jobs[0].tenant


def next_turn(running: collections.deque[Running]) -> Running | None:
    """The batch that takes the next step. First its tenant: one passed over for ``MAX_PASSED_S`` of
    other tenants' chunks (the longest passed over), else the one with the smallest ready batch. Then,
    within it, a batch passed over ``MAX_PASSED_TURNS`` times by its own tenant's, else its smallest.
    A short read (a polite tenant's one question) then waits only for the chunk in progress, not for
    turns with a tenant's forty long states (issue 39: p50 14 s beside such a flood, taking every
    other chunk), and a long batch still gets a chunk every ``MAX_PASSED_S`` however many short ones
    arrive. None: every batch is blocked."""
    ready = [batch for batch in running if not batch.blocked]
    if not ready:
        return None
    overdue = [batch for batch in ready if batch.passed_s >= MAX_PASSED_S]
    if overdue:
        tenant = max(overdue, key=lambda batch: batch.passed_s).tenant
    else:
        tenant = min(ready, key=lambda batch: batch.size).tenant
    own = [batch for batch in ready if batch.tenant == tenant]
    overdue = [batch for batch in own if batch.passed >= MAX_PASSED_TURNS]
    if overdue:
        return max(overdue, key=lambda batch: batch.passed)
    return min(own, key=lambda batch: batch.size)


def passed_over(running: collections.deque[Running], turn: Running, seconds: float) -> None:
    """After ``turn`` computed a chunk in ``seconds``: its tenant's batches were not passed over by
    other tenants, and ``turn`` not by its own; the others were."""
    for batch in running:
        if batch.tenant != turn.tenant:
            batch.passed_s += seconds
        else:
            batch.passed_s = 0.0
            batch.passed = 0 if batch is turn else batch.passed + 1


def busy_tenants(running: collections.deque[Running]) -> frozenset[str | None]:
    """Tenants running as many batches as one tenant may: their next batch waits."""
    counts = collections.Counter(batch.tenant for batch in running)
    return frozenset(tenant for tenant, count in counts.items() if count >= RUNNING_BATCHES)


SHORT_CHUNK_TOKENS = 128
"""A chunk's tokens at most in a long batch (over ``LONG_BATCH_TOKENS``), or beside other batches:
a chunk in torch cannot be stopped, so it is what a short read arriving behind a long batch waits
for. 128 tokens take ~0.2-0.3 s on two cores beside 1,200-token prompts, where 512 took ~0.7 s, at
the same tokens a second within the machine's noise (4 × 1,200-token prompts: 279–385 tokens/s at
128, 315–371 at 512). A short batch alone keeps ``chunk_tokens``: it is one or two chunks, and small
chunks of short prompts cost their overhead."""
YIELDING_CHUNK_TOKENS = 64
"""A chunk's tokens at most while other tenants are active (``ACTIVE_S``): their next read waits for
the chunk in progress, and for one more between its engine calls, so the chunk's size is their
latency. Issue 39's probe, a polite tenant's p99 beside a 20 × 1,200-token flood (one run each, ~100
ms alone): 475 ms with 128-token chunks; 580–732 ms (5 runs) with 64 only while its reads were
queued or running, the chunk between its engine calls still 128; 291–1,141 ms (3 runs) with 64
throughout; 266–407 ms (4 runs) with this rule, 64 while another tenant is active. Not the default for a long batch when nobody else is active: 4 × 1,200-token prompts
compute at 341 tokens/s in 64-token chunks against 476 in 128 (median of 3, 2 cores).

32 was tried (2026-12-04, same probe, 6 runs): p99 203–385 ms against 102–123 ms alone, 2 runs of 6
over 3×, for 95 ms chunks instead of 142 and 336 tokens/s instead of 451 on a 1,200-token prompt. The
slowest polite reads were not waiting for a chunk: one's own 30 tokens took ~340 ms in the engine
(~80 ms otherwise), another spent ~250 ms outside the server's own latency (before its handler ran),
so smaller chunks do not remove the tail, and 64 stays. Where a chunk's time goes (cProfile, 64 tokens, 1,200-token prompt): the projections 63%,
attention 15%, reassembling the past keys 6%; keeping a running past across chunks would save little."""
ACTIVE_S = 5.0
"""A tenant that started a batch this recently is active: the others' long batches yield to it."""
LONG_BATCH_TOKENS = 2_048
"""Prompt tokens over which a batch computes in short chunks even alone: it runs for seconds, and
whoever arrives meanwhile should wait for one short chunk, not for a long one already in torch."""


def chunk_limit(chunk_tokens: int, batch_tokens: int, *, others_active: bool, batches_running: int) -> int:
    """A batch's next chunk at most: ``YIELDING_CHUNK_TOKENS`` for a batch another tenant's reads may
    arrive behind (``others_active``: one started a batch within ``ACTIVE_S``, or one is queued);
    ``SHORT_CHUNK_TOKENS`` for a long batch or beside other batches; else the engine's ``chunk_tokens``."""
    if batch_tokens > YIELDING_CHUNK_TOKENS and others_active:
        return min(chunk_tokens, YIELDING_CHUNK_TOKENS)
    if batch_tokens > LONG_BATCH_TOKENS or batches_running > 1:
        return min(chunk_tokens, SHORT_CHUNK_TOKENS)
    return chunk_tokens


class ActiveTenants:
    """When each tenant last started a batch: who is active (within ``ACTIVE_S``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_started: dict[str | None, float] = {}

    def started(self, tenant: str | None) -> None:
        now = self.clock()
        self.last_started[tenant] = now
        if len(self.last_started) > MAX_RUNNING_BATCHES:  # forget who has been quiet long enough
            self.last_started = {t: at for t, at in self.last_started.items() if now - at < ACTIVE_S}

    def besides(self, tenant: str | None) -> bool:
        """Whether a tenant other than ``tenant`` is active."""
        now = self.clock()
        return any(t != tenant and now - at < ACTIVE_S for t, at in self.last_started.items())
