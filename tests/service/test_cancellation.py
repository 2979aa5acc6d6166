"""Work for a client that disconnected is cancelled: abandoned reads are not computed, a later request
is not delayed by them, and the disconnect is its own outcome in metrics and logs (never a 500).

A real uvicorn server on a loopback port and the real embedded model; a subclass of the local engine
counts the reads its compute thread actually starts. Batches of at most two reads, at most
``RUNNING_BATCHES`` of them taken at once: what may still run after clients leave is those batches.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from deploy.processes import serving
from readers.engines.base import LocalBatching
from readers.engines.local import LocalEngine
from readers.engines.turns import RUNNING_BATCHES
from service.admission import AdmissionLimits
from service.app import create_app


class CountingEngine(LocalEngine):
    """The embedded engine, counting the reads its compute thread starts."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.computed = 0
        self._lock = threading.Lock()

    def _compute_steps(self, prompts, reuse, **options):
        with self._lock:
            self.computed += len(prompts)
        return (yield from super()._compute_steps(prompts, reuse, **options))


BATCH = 2


@pytest.fixture(scope="module")
def counting_engine(embedded_model_dir):
    engine = CountingEngine(embedded_model_dir, batching=LocalBatching(max_batch=BATCH))
    yield engine
    asyncio.run(engine.aclose())


def question_body(state: str, questions: int = 1) -> dict:
    return {
        "state": state,
        "questions": {
            f"q{i}": {"type": "noul", "instructions": f"Is point {i} about billing?"}
            for i in range(questions)
        },
    }


def state(i: int, words: int) -> str:
    return f"Ticket {i}: " + " ".join(f"charge{i}-{j}" for j in range(words))


async def abandon(url: str, bodies: list[dict], after_s: float) -> tuple[int, int]:
    """Send every body at once, each client giving up after ``after_s``: (gave up, answered 200)."""

    async def one(body):
        async with httpx.AsyncClient(base_url=url, timeout=after_s) as client:
            try:
                return (await client.post("/v1/systemone", json=body)).status_code
            except httpx.TimeoutException:
                return None

    statuses = await asyncio.gather(*(one(b) for b in bodies))
    return statuses.count(None), statuses.count(200)


def settled(engine: CountingEngine, quiet_s: float = 3.0, limit_s: float = 120.0) -> int:
    """The count once no forward pass has started for ``quiet_s``."""
    deadline = time.monotonic() + limit_s
    last = engine.computed
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        if engine.computed == last:
            return last
        last = engine.computed
    raise AssertionError("the engine kept computing")


async def timed_answer(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        started = time.monotonic()
        response = await client.post("/v1/systemone", json=question_body("Please refund the double charge."))
        assert response.status_code == 200, response.text
        return time.monotonic() - started


# Admission off in effect: every read reaches the engine's queue, which is what cancellation must
# empty; no deadline either, so only the client leaving stops work (a loaded CI core is slow).
UNBOUNDED = AdmissionLimits(
    in_flight_cost=10**9, queued_cost=10**9, request_cost=10**9, max_wait_s=3600, deadline_s=3600
)


@pytest.mark.slow  # a flood of long requests; its own engine, loaded again
@pytest.mark.anyio
async def test_flood_of_disconnecting_clients_is_not_computed(counting_engine):
    """The probe: 152 of 200 clients gave up after 5 s, the server still computed every one, and a
    later request waited 15 s. Now only the batches the engine had taken run."""
    app = create_app(counting_engine, admission=UNBOUNDED)
    with serving(app) as url:
        await timed_answer(url)  # warm
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            started = time.monotonic()
            assert (await client.post("/v1/systemone", json=question_body(state(-1, 150)))).status_code == 200
            one_read_s = time.monotonic() - started  # one flood-sized read, nothing else running
        before = counting_engine.computed
        gave_up, answered = await abandon(url, [question_body(state(i, 150)) for i in range(60)], after_s=1.0)
        later = await timed_answer(url)
        computed = settled(counting_engine) - before - 1  # less the later request's own read
        async with httpx.AsyncClient(base_url=url) as client:
            metrics = (await client.get("/metrics")).text
    print(
        f"gave up {gave_up}, answered {answered}, computed {computed}, one read {one_read_s:.2f} s, later {later:.2f} s"
    )
    assert gave_up >= 30 and gave_up + answered == 60
    # Besides the answered ones, only the batches taken when the clients left ran, so the later
    # request waited for at most those, not for the ~30 batches the flood queued. Counted, not timed:
    # its wall-clock wait (printed) moves with whatever else the machine runs.
    assert computed <= answered + RUNNING_BATCHES * BATCH, (computed, answered, gave_up)
    disconnected = next(
        line for line in metrics.splitlines() if 'status="disconnected"' in line and "/v1/systemone" in line
    )
    assert float(disconnected.rsplit(" ", 1)[1]) == gave_up
    assert 'status="500"' not in metrics


@pytest.mark.anyio
@pytest.mark.slow  # its own engine, loaded again, and long reads
async def test_an_abandoned_long_request_does_not_hold_the_engine(counting_engine):
    """The probe: one ~7,000-token state with 4 questions, abandoned, blocked both workers and made
    the next small request wait 81 s. Now its questions share the state's KV and run as one job: if
    a batch took it before the client left, it runs once (torch cannot stop a forward pass), and the
    next request waits for that one job at most; if not, none of it runs. The state here is ~1,300
    tokens to keep the test short on CI cores."""
    app = create_app(counting_engine, admission=UNBOUNDED)
    long_request = question_body(state(999, 200), questions=4)
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            started = time.monotonic()
            assert (
                await client.post("/v1/systemone", json=question_body(state(998, 200), questions=4))
            ).status_code == 200
            one_job_s = time.monotonic() - started  # the same shape, answered, nothing else running
        before = counting_engine.computed
        gave_up, _ = await abandon(url, [long_request], after_s=0.2 * one_job_s)
        later = await timed_answer(url)
        computed = settled(counting_engine) - before - 1  # less the later request's own read
    print(f"computed {computed} of 4, one job {one_job_s:.2f} s, later {later:.2f} s")
    assert gave_up == 1
    assert computed in (0, 4), computed  # the job runs whole or not at all, and never twice
    assert later < 2 * one_job_s + 2.0, (later, one_job_s)
