"""The local engine's job queue: the reads of each ``read_many`` call, waiting for its compute thread.

Callers (on the event loop) put jobs; the compute thread (``readers/engines/local.py``) takes them as
batches: on an idle engine it waits ``batch_window_ms`` for more to arrive, while it computes it takes
only what is queued. A job whose caller is cancelled while it queues is dropped when taken, so it
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


class ReadsAbandoned(Exception):
    """A batch stopped between chunks: every caller of its reads was cancelled."""


class EngineClosed(RuntimeError):
    """A read sent to a local engine that was closed, or whose compute thread stopped."""


class JobQueue:
    """Reads waiting for the compute thread."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._jobs: collections.deque[Job] = collections.deque()
        self._closed = False
        self.dropped_reads = 0  # queued reads whose callers were cancelled before a batch took them

    def put(self, job: Job) -> None:
        with self._ready:
            if self._closed:  # nothing would ever take it
                raise EngineClosed("the local engine is closed")
            self._jobs.append(job)
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
                job = self._jobs.popleft()
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(error)

    def take(self, *, idle: bool, window_s: float, max_rows: int) -> list[Job] | None:
        """The next batch: queued jobs up to ``max_rows`` reads (the last one taken may pass it; at
        least one job), a job whose caller was cancelled while it queued dropped (nothing is
        computed for it). ``idle`` (nothing else to compute): wait for a first job, then for those
        arriving within ``window_s`` of it; otherwise take only what is queued, maybe nothing ([]).
        None: closed and nothing queued."""
        with self._ready:
            batch: list[Job] = []
            rows = 0
            while not batch:
                if not self._jobs:
                    if self._closed:
                        return None
                    if not idle:
                        return batch
                    self._ready.wait()
                    continue
                rows = self._take_queued(batch, rows, max_rows)
            deadline = time.monotonic() + window_s
            while idle and rows < max_rows and not self._closed:
                if self._jobs:
                    rows = self._take_queued(batch, rows, max_rows)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            return batch

    def _take_queued(self, batch: list[Job], rows: int, max_rows: int) -> int:
        while self._jobs and (not batch or rows < max_rows):
            job = self._jobs.popleft()
            if job.future.set_running_or_notify_cancel():
                batch.append(job)
                rows += len(job.requests)
            else:
                self.dropped_reads += len(job.requests)
        return rows
