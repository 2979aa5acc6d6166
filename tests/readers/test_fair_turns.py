"""The local engine takes turns between tenants (issue 39): one tenant's queued reads do not make
another's one read wait for all of them. The queue alone, then the embedded model."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures

import pytest

from readers.engines.base import LocalBatching, ReadRequest
from readers.engines.jobs import Job, JobQueue
from readers.engines.local import LocalEngine
from readers.engines.turns import (
    ACTIVE_S,
    MAX_PASSED_S,
    MAX_PASSED_TURNS,
    SHORT_CHUNK_TOKENS,
    YIELDING_CHUNK_TOKENS,
    Running,
    next_turn,
    passed_over,
)


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


def running(tenant: str, tokens: int) -> Running:
    requests = [ReadRequest(tuple(range(tokens)), (4,), ("x",), tenant=tenant)]
    return Running([Job(requests, None, True, 0.0, concurrent.futures.Future())], iter(()))


def test_a_short_read_takes_its_steps_in_a_row_and_a_long_batch_still_gets_its_turn():
    """The smallest batch steps; a tenant passed over for MAX_PASSED_S of others' chunks steps next,
    however small the others. Seconds, not turns: b's few short steps go in a row (with a count of
    turns, a's chunk came between each of them: issue 39's p99 935 ms beside a flood)."""
    a1, a2, b = running("a", 4_000), running("a", 5_000), running("b", 100)
    batches = collections.deque([a1, a2, b])
    step = MAX_PASSED_S / 5.5
    for _ in range(5):  # b's steps: a is passed over, but not for long enough yet
        assert next_turn(batches) is b
        passed_over(batches, b, step)
    passed_over(batches, b, step)
    assert next_turn(batches) is a1  # a's turn now: its smaller batch
    passed_over(batches, a1, 0.2)
    assert a1.passed_s == a2.passed_s == 0 and b.passed_s == 0.2
    assert next_turn(batches) is b


def test_within_a_tenant_a_batch_passed_over_by_its_own_gets_a_turn():
    a1, a2 = running("a", 4_000), running("a", 5_000)
    batches = collections.deque([a1, a2])
    for _ in range(MAX_PASSED_TURNS):
        assert next_turn(batches) is a1
        passed_over(batches, a1, 1.0)  # its own tenant's chunks do not age it in seconds
    assert a2.passed_s == 0 and next_turn(batches) is a2


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


@pytest.mark.anyio
async def test_a_long_batch_yields_in_short_chunks_only_while_another_tenant_is_active(embedded_model_dir):
    """A chunk in torch cannot be stopped: another tenant's read waits for the one in progress. So a
    long batch computes in YIELDING_CHUNK_TOKENS while another tenant is active (started a batch
    within ACTIVE_S, or has reads queued), and in the faster SHORT_CHUNK_TOKENS when nobody else is."""
    engine = LocalEngine(embedded_model_dir, batching=LocalBatching(chunk_tokens=512, prefix_cache_mib=0))
    try:
        assert engine._chunk_limit(4_000, "a") == SHORT_CHUNK_TOKENS
        assert engine._chunk_limit(300, "a") == 512  # a short batch alone: whole chunks
        engine._active.started("a")
        assert engine._chunk_limit(4_000, "a") == SHORT_CHUNK_TOKENS  # its own batches do not count
        engine._active.started("b")
        assert engine._chunk_limit(4_000, "a") == YIELDING_CHUNK_TOKENS
        engine._active.last_started["b"] -= ACTIVE_S  # b has been quiet since
        assert engine._chunk_limit(4_000, "a") == SHORT_CHUNK_TOKENS
        engine._jobs.put(job("c"))  # queued, not started: it waits for a's chunk all the same
        assert engine._chunk_limit(4_000, "a") == YIELDING_CHUNK_TOKENS
    finally:
        await engine.aclose()
