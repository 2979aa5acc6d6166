"""The load generator: bounded concurrency, failures counted, percentiles from successes."""

from __future__ import annotations

import asyncio

import pytest

from eval.capacity.load import run_load

pytestmark = pytest.mark.anyio


async def test_never_exceeds_the_concurrency_and_counts_failures():
    in_flight = peak = 0

    async def send(i: int) -> bool:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        if i % 10 == 0:
            raise RuntimeError("engine fault")
        return i % 10 != 5

    result = await run_load(send, requests=40, concurrency=4)
    assert peak == 4
    assert (result.completed, result.failed) == (32, 8)
    assert result.p50_ms >= 10 and result.p99_ms >= result.p90_ms >= result.p50_ms
    assert result.decisions_per_s == pytest.approx(32 / result.wall_s)


async def test_rejects_nonsense_sizes():
    async def send(i: int) -> bool:
        return True

    with pytest.raises(ValueError):
        await run_load(send, requests=0, concurrency=1)
