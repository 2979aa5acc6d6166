"""The local engine takes turns between tenants (issue 39): one tenant's queued reads do not make
another's one read wait for all of them. The queue alone, then the embedded model."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from readers.engines.base import LocalBatching, ReadRequest
from readers.engines.jobs import Job, JobQueue
from readers.engines.local import LocalEngine


def job(tenant: str | None, reads: int = 1) -> Job:
    requests = [ReadRequest((1, 2, 3), (4,), ("x",), tenant=tenant)] * reads
    return Job(requests, None, True, 0.0, concurrent.futures.Future())


def test_a_batch_is_one_tenants_and_tenants_take_turns():
    queue = JobQueue()
    flood = [job("a", 4) for _ in range(10)]
    for item in flood:
        queue.put(item)
    polite = job("b")
    queue.put(polite)
    first = queue.take(idle=False, window_s=0, max_rows=8)
    assert first == flood[:2]  # a's turn: its first jobs up to the batch size, a's only
    assert queue.take(idle=False, window_s=0, max_rows=8) == [polite]  # then b's, before a's next
    assert queue.take(idle=False, window_s=0, max_rows=8) == flood[2:4]


def test_a_tenant_at_its_running_limit_waits_while_others_may_start():
    queue = JobQueue()
    a, b = job("a"), job("b")
    queue.put(a)
    queue.put(b)
    assert queue.take(idle=False, window_s=0, max_rows=8, busy=frozenset({"a"})) == [b]
    assert queue.take(idle=False, window_s=0, max_rows=8, busy=frozenset({"a"})) == []
    assert queue.take(idle=False, window_s=0, max_rows=8) == [a]


def test_cancelled_jobs_are_dropped_and_a_closed_queue_drains():
    queue = JobQueue()
    gone, kept = job("a"), job("a")
    gone.future.cancel()
    queue.put(gone)
    queue.put(kept)
    assert queue.take(idle=False, window_s=0, max_rows=8) == [kept] and queue.dropped_reads == 1
    queue.close()
    assert queue.take(idle=True, window_s=0, max_rows=8) is None


@pytest.mark.slow  # a second embedded engine and sixteen reads through it
@pytest.mark.anyio
async def test_another_tenants_read_ends_before_a_flooding_tenants_queue(embedded_model_dir):
    """Tenant a queues eight calls of two 120-token reads; tenant b then asks one short read. b's read
    ends after a few of a's batches, not after a's whole queue (before tenants: behind all of it)."""
    engine = LocalEngine(embedded_model_dir, batching=LocalBatching(max_batch=2, prefix_cache_mib=0))
    try:
        ended: list[str] = []

        async def read(name: str, tenant: str, prompts: list[tuple[int, ...]]) -> None:
            await engine.read_many([ReadRequest(p, (11,), ("x",), tenant=tenant) for p in prompts])
            ended.append(name)

        flood = [
            asyncio.create_task(read(f"a{i}", "a", [tuple(range(100 + i * 10 + j, 220 + i * 10 + j)) for j in range(2)]))
            for i in range(8)
        ]  # fmt: skip
        await asyncio.sleep(0.05)
        polite = asyncio.create_task(read("b", "b", [(5, 6, 7, 8)]))
        await asyncio.gather(polite, *flood)
    finally:
        await engine.aclose()
    # At most the batches already running or next in a's turn end first: two running, one more taken
    # while b waits for its turn.
    assert ended.index("b") <= 3, ended
