"""Which running batch the local engine's compute thread steps next (``readers/engines/local.py``,
module docstring, 4): tenants take turns, the smallest batch first, none passed over for long.

Pure bookkeeping over ``Running`` batches (their jobs, steps and how their turns went), apart from
the engine so the rule reads in one place and is tested without a model.
"""

from __future__ import annotations

import collections
from collections.abc import Generator
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
