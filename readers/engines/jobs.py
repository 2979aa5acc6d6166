"""The local engine's job queue: the reads of each ``read_many`` call, waiting for its compute thread.

Callers (on the event loop) put jobs; the compute thread (``readers/engines/local.py``) takes them as
batches: on an idle engine it waits ``batch_window_ms`` for more to arrive, while it computes it takes
only what is queued. Jobs queue per tenant (``ReadRequest.tenant``) and a batch holds one tenant's
jobs, the tenants taking turns: a tenant that queued forty reads delays another's one read by one
batch at most, not by forty (issue 39: one tenant's batches shut every other out). Within a tenant,
jobs go in order. A job whose caller is cancelled while it queues is dropped when taken, so it
costs nothing; one cancelled after it was taken is marked abandoned, and a batch whose every job is
abandoned stops at its next chunk (``ReadsAbandoned``). Nothing here needs torch.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from readers.engines.base import ReadRequest


@dataclass
class Job:
    """The reads of one ``read_many`` call, waiting for a batch."""

    requests: Sequence[ReadRequest]
    top_k: int | None
    share_prefix: bool
    submitted: float
    future: concurrent.futures.Future
    # Set when the caller is cancelled after the compute thread took the job (its future can no
    # longer be cancelled): a batch whose every job is abandoned stops at its next chunk.
    abandoned: threading.Event = field(default_factory=threading.Event)

    @property
    def tenant(self) -> str | None:
        """Whose reads (one ``read_many`` call is one reader's, so one tenant's)."""
        return self.requests[0].tenant if self.requests else None


class ReadsAbandoned(Exception):
    """A batch stopped between chunks: every caller of its reads was cancelled."""


class EngineClosed(RuntimeError):
    """A read sent to a local engine that was closed, or whose compute thread stopped."""


class JobQueue:
    """Reads waiting for the compute thread, a queue per tenant, tenants served in turn."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        # Tenants with queued jobs, in the order they are next served (the one served goes last).
        self._jobs: collections.OrderedDict[str | None, collections.deque[Job]] = collections.OrderedDict()
        self._closed = False
        self.dropped_reads = 0  # queued reads whose callers were cancelled before a batch took them

    @property
    def waiting(self) -> bool:
        """Whether any job is queued (read without the lock: a hint, stale by one put at most)."""
        return bool(self._jobs)

    def waiting_besides(self, tenant: str | None) -> bool:
        """Whether a job of any tenant but ``tenant`` is queued."""
        with self._ready:
            return any(queued != tenant for queued in self._jobs)

    def put(self, job: Job) -> None:
        with self._ready:
            if self._closed:  # nothing would ever take it
                raise EngineClosed("the local engine is closed")
            self._jobs.setdefault(job.tenant, collections.deque()).append(job)
            self._ready.notify_all()

    def close(self) -> None:
        """The compute thread takes what is queued, then ends."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def fail(self, error: BaseException) -> None:
        """Closes the queue and fails every queued job with ``error`` (the compute thread stopped)."""
        with self._ready:
            self._closed = True
            while self._jobs:
                _, jobs = self._jobs.popitem(last=False)
                for job in jobs:
                    if job.future.set_running_or_notify_cancel():
                        job.future.set_exception(error)

    def take(
        self, *, idle: bool, window_s: float, max_rows: int, busy: frozenset[str | None] = frozenset()
    ) -> list[Job] | None:
        """The next batch: one tenant's queued jobs up to ``max_rows`` reads (the last one taken may
        pass it; at least one job), from the tenant whose turn it is among those not in ``busy``
        (tenants already running as many batches as they may), a job whose caller was cancelled
        while it queued dropped (nothing is computed for it). ``idle`` (nothing else to compute):
        wait for a first job, then for that tenant's jobs arriving within ``window_s`` of it;
        otherwise take only what is queued, maybe nothing ([]). None: closed and nothing queued."""
        with self._ready:
            batch: list[Job] = []
            rows = 0
            tenant = None
            while not batch:
                tenant = self._next_tenant(busy)
                if tenant is _NOBODY:
                    if self._closed and not self._jobs:
                        return None
                    if not idle or self._closed:
                        return batch
                    self._ready.wait()
                    continue
                rows = self._take_queued(tenant, batch, rows, max_rows)
            deadline = time.monotonic() + window_s
            while idle and rows < max_rows and not self._closed:
                if tenant in self._jobs:
                    rows = self._take_queued(tenant, batch, rows, max_rows)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            return batch

    def _next_tenant(self, busy: frozenset[str | None]):
        return next((tenant for tenant in self._jobs if tenant not in busy), _NOBODY)

    def _take_queued(self, tenant: str | None, batch: list[Job], rows: int, max_rows: int) -> int:
        jobs = self._jobs[tenant]
        while jobs and (not batch or rows < max_rows):
            job = jobs.popleft()
            if job.future.set_running_or_notify_cancel():
                batch.append(job)
                rows += len(job.requests)
            else:
                self.dropped_reads += len(job.requests)
        # Served: its next jobs wait for every other tenant's turn (it goes last), or it leaves.
        del self._jobs[tenant]
        if jobs:
            self._jobs[tenant] = jobs
        return rows


_NOBODY = object()
"""No tenant has queued jobs that may run now (``tenant`` None is the service's own reads)."""
