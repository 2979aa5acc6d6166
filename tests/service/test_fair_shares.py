"""Fair shares in admission (issue 39): a flooding tenant cannot shut another out, each tenant's queue
and tokens per minute are its own, tenants waiting are served by weight, and the measured rate comes
from completed work only. Admission alone, on a fake clock: no engine, no wall-clock figure."""

from __future__ import annotations

import asyncio

import pytest

from service.admission import Admission, AdmissionLimits, CostRate
from service.errors import Overloaded, RequestTooCostly, TenantLimited
from service.scopes import EQUAL_SHARE, Share

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Holder:
    """Requests that hold their admission until released, recording the order they started in."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.started: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    async def hold(self, name: str, cost: int, tenant: str, share: Share = EQUAL_SHARE) -> None:
        self.release[name] = asyncio.Event()
        async with self.admission.admit(cost, tenant, share):
            self.started.append(name)
            await self.release[name].wait()

    def start(self, name: str, cost: int, tenant: str, share: Share = EQUAL_SHARE) -> asyncio.Task:
        return asyncio.create_task(self.hold(name, cost, tenant, share))


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_tenant_with_nothing_in_flight_starts_beside_a_flood():
    """Tenant a holds one request far over in_flight_cost and queues another; tenant b's request
    starts at once instead of queueing behind a's work, and a's third is refused as a's own (429)."""
    admission = Admission(AdmissionLimits(in_flight_cost=100, queued_cost=1_000, tenant_queued_cost=300))
    holder = Holder(admission)
    a1 = holder.start("a1", 900, "a")
    await settle()
    a2 = holder.start("a2", 900, "a")  # the head of a's empty queue: let in over its bound
    await settle()
    b1 = holder.start("b1", 40, "b")
    await settle()
    assert holder.started == ["a1", "b1"] and admission.tenants["a"].queued == 900
    with pytest.raises(TenantLimited) as refused:
        admission.refuse_if_full("a")  # before a's third is even read
    assert refused.value.status_code == 429 and refused.value.retry_after_s >= 1
    assert "this tenant's work is at its share" in refused.value.message
    admission.refuse_if_full("b")  # b is not refused for a's queue
    for name in ("a1", "b1", "a2"):
        holder.release[name].set()
        await settle()
    await asyncio.gather(a1, a2, b1)
    assert holder.started == ["a1", "b1", "a2"] and admission.tenants == {}


async def test_one_tenant_alone_at_capacity_gets_529_not_429():
    """With no other tenant to serve, a full queue is the service's capacity: 529, as before tenants."""
    admission = Admission(AdmissionLimits(in_flight_cost=100, queued_cost=1_000, tenant_queued_cost=300))
    holder = Holder(admission)
    first = holder.start("a1", 100, "a")
    await settle()
    second = holder.start("a2", 300, "a")
    await settle()
    with pytest.raises(Overloaded) as refused:
        admission.refuse_if_full("a")
    assert refused.value.status_code == 529
    holder.release["a1"].set()
    holder.release["a2"].set()
    await asyncio.gather(first, second)


async def test_waiting_tenants_are_served_by_weight_not_arrival():
    """Tenants a and b each hold work in flight; a queues six requests before b queues three, b with
    twice a's weight. As capacity frees one request at a time, the fair queue serves b's work at twice
    a's rate (start tags b 50, 100, 150 against a 100, 200, …), not after all of a's."""
    admission = Admission(AdmissionLimits(in_flight_cost=300, queued_cost=10_000, tenant_queued_cost=5_000))
    holder = Holder(admission)
    heavy = Share(weight=2.0)
    tasks = [holder.start("a-long", 100, "a"), holder.start("b-long", 100, "b", heavy)]
    await settle()
    tasks.append(holder.start("y", 100, "y"))  # fills the service: everyone below waits
    await settle()
    tasks += [holder.start(f"a{i}", 100, "a") for i in range(6)]
    await settle()
    tasks += [holder.start(f"b{i}", 100, "b", heavy) for i in range(3)]
    await settle()
    assert holder.started == ["a-long", "b-long", "y"]
    holder.release["y"].set()
    for _ in range(9):  # one request at a time: each ends once the next has started
        await settle()
        holder.release[holder.started[-1]].set()
    holder.release["a-long"].set()
    holder.release["b-long"].set()
    await asyncio.gather(*tasks)
    served = holder.started[3:]
    assert served[:4] == ["b0", "a0", "b1", "b2"] or served[:4] == ["b0", "b1", "a0", "b2"], served
    assert served[4:] == [f"a{i}" for i in range(1, 6)]


async def test_tokens_per_minute_is_a_bucket_per_tenant():
    clock = Clock()
    admission = Admission(AdmissionLimits(), clock=clock)
    limited = Share(tokens_per_minute=600)  # 10 tokens a second, a minute's worth held
    async with admission.admit(500, "a", limited):
        pass
    with pytest.raises(TenantLimited) as short:
        async with admission.admit(200, "a", limited):
            pass
    # 100 left of 200: 100 more tokens at 10/s is 10 s.
    assert short.value.status_code == 429 and short.value.retry_after_s == 10
    assert "tokens_per_minute (600)" in short.value.message
    async with admission.admit(500, "b", limited):  # another tenant's bucket is its own
        pass
    clock.now += 10
    async with admission.admit(200, "a", limited):  # refilled
        pass
    with pytest.raises(RequestTooCostly) as never:  # more than a minute's worth: no wait would do
        async with admission.admit(601, "a", limited):
            pass
    assert never.value.status_code == 413 and "at most 600 a minute" in never.value.message


async def test_a_waiter_cancelled_gets_its_tokens_back():
    clock = Clock()
    admission = Admission(AdmissionLimits(in_flight_cost=100), clock=clock)
    limited = Share(tokens_per_minute=1_000)
    holder = Holder(admission)
    running = holder.start("a1", 100, "a", limited)
    await settle()
    waiting = holder.start("a2", 300, "a", limited)
    await settle()
    assert admission.tenants["a"].tokens == pytest.approx(600)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.tenants["a"].tokens == pytest.approx(900) and admission.queued == 0
    holder.release["a1"].set()
    await running


async def test_the_rate_is_learnt_from_completed_work_only():
    """A request cut part-way adds neither its tokens nor its time: the issue's abandoned batch made
    the next small request look like 4 tokens/s and every large request a 413 for a minute after."""
    clock = Clock()
    rate = CostRate(clock=clock, min_busy_s=1.0, min_tokens=1_000)
    cut = rate.started(30_000)
    clock.now += 5
    rate.ended(cut, completed=False)
    small = rate.started(20)
    clock.now += 1
    rate.ended(small, completed=True)
    assert rate.tokens_per_s is None and rate.best_tokens_per_s is None  # 20 tokens: not a speed
    for _ in range(2):  # two requests sharing 2 s: each had 1 s of it
        one, two = rate.started(1_000), rate.started(1_000)
        clock.now += 2
        rate.ended(one, completed=True)
        rate.ended(two, completed=True)
    assert rate.tokens_per_s == pytest.approx(4_020 / 5, rel=0.02)


async def test_a_large_request_after_an_abandoned_one_is_not_refused_up_front():
    clock = Clock()
    admission = Admission(AdmissionLimits(request_cost=100_000, deadline_s=60), clock=clock)

    async def abandoned():
        async with admission.admit(40_000, "a"):
            clock.now += 5
            await asyncio.Event().wait()

    task = asyncio.create_task(abandoned())
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with admission.admit(30, "a"):
        clock.now += 3
    async with admission.admit(1_600, "b"):  # 1,200 words: admitted, not a 413 against 10 tokens/s
        pass


async def test_over_http_a_polite_tenant_is_answered_beside_a_flood_and_a_limited_one_gets_429(
    client_factory, local_engine, tmp_path
):
    """Through the app with keys: tenant a's large request holds the engine (its reads wait on a
    gate), and so does one of tenant d's; a's next ones queue or are refused as a's own (429, d has
    work too); tenant b's small request is answered meanwhile; tenant c, limited to 100 tokens a
    minute, is refused naming its limit."""
    from readers.engines.base import ReadMode
    from service.keys import Keyring
    from tests.service.support import favour_first, function_engine

    gate = asyncio.Event()
    tokenizer = local_engine.tokenizer

    async def fn(request):
        if "Flood" in tokenizer.decode(request.prompt_ids):
            await gate.wait()
        return favour_first(request)

    keys = tmp_path / "keys"
    keys.write_text(
        "tenant-a-key-0123456789 tenant=a\ntenant-b-key-0123456789 tenant=b\n"
        "tenant-c-key-0123456789 tenant=c tokens_per_minute=100\ntenant-d-key-0123456789 tenant=d\n"
    )
    limits = AdmissionLimits(in_flight_cost=200, queued_cost=20_000, tenant_queued_cost=2_000)

    def ask(key, state):
        body = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}
        return client.post("/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"})

    async with client_factory(
        function_engine(local_engine, fn, ReadMode.EXACT), api_keys=Keyring(keys, {}), admission=limits
    ) as client:
        flood = [asyncio.create_task(ask("tenant-a-key-0123456789", "Flood " * 400))]
        await asyncio.sleep(0.3)
        other = asyncio.create_task(ask("tenant-d-key-0123456789", "Flood of d"))
        await asyncio.sleep(0.3)
        flood += [asyncio.create_task(ask("tenant-a-key-0123456789", f"Flood {i} " * 400)) for i in range(3)]
        await asyncio.sleep(0.3)
        polite = await ask("tenant-b-key-0123456789", "A short question.")
        limited = await ask("tenant-c-key-0123456789", "Flood is not what c sends, but " + "word " * 150)
        assert not flood[0].done()
        gate.set()
        floods = await asyncio.gather(*flood)
        assert (await other).status_code == 200
    assert polite.status_code == 200
    statuses = sorted(r.status_code for r in floods)
    assert statuses[0] == 200 and 429 in statuses, statuses  # a's own queue is full: a is told to slow down
    refused = next(r for r in floods if r.status_code == 429)
    assert refused.json()["detail"]["error_type"] == "rate_limit_error" and "retry-after" in refused.headers
    assert limited.status_code == 413 and "this tenant may schedule at most 100 a minute" in limited.text
