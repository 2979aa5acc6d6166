"""A decision costs the same with 25 stored fits as with 50,000: lookups read the store's memory, never
the database, on the event loop (the request's thread here), however many fits other tenants have stored
and whatever this process's other threads commit. Counted, not timed; the p50s are printed."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace

import pytest

from eval.decisions.tasks import TASKS
from tests.calibration.stores import KEY, counting_store
from tests.service.support import RUN_SUMMARIES

pytestmark = pytest.mark.anyio

QUESTION = TASKS["sst2"].question()


async def decide_p50_ms(client, n: int) -> float:
    took = []
    for i in range(n):
        start = time.perf_counter()
        reply = await client.post("/decide", json={"state": f"review {i}", "questions": {"s": QUESTION}})
        took.append(time.perf_counter() - start)
        assert reply.status_code == 200, reply.text
    return 1000 * statistics.median(took)


@pytest.mark.slow  # 50,000 fits stored, one transaction each
async def test_a_decision_never_queries_the_calibrations_however_many_are_stored(
    client_factory, quick_engine, tmp_path
):
    store = counting_store(str(tmp_path / "c.sqlite3"))
    try:
        for n in range(25):
            store.add_calibration(replace(KEY, tenant=f"other{n}"), temperature=1.2, n=50, source="examples")
        async with client_factory(quick_engine, store=store) as client:
            first = await client.post("/decide", json={"state": "warm-up", "questions": {"s": QUESTION}})
            assert first.json()["answers"]["s"]["x_reading"]["calibration"] is None
            me = threading.get_ident()  # the event loop's thread: ASGI runs the app on it
            at_start = store.connections_by.count(me)
            small = await decide_p50_ms(client, 50)
            assert store.connections_by.count(me) == at_start  # not one query from the loop
            # Other tenants' fits, 20 per key (what retention keeps), stored as the decisions go on.
            for n in range(50_000 - 25):
                other = replace(KEY, tenant=f"t{n // 20}")
                store.add_calibration(other, temperature=1.1, n=50, source="examples")
            stored = store.connections_by.count(me)
            large = await decide_p50_ms(client, 50)
            assert store.connections_by.count(me) == stored  # nor with 50,000 fits stored
            assert len(store.connections_by) > stored  # the decisions were recorded: in worker threads
        RUN_SUMMARIES.append(f"decision p50 via the app: {small:.2f} ms at 25 fits, {large:.2f} ms at 50,000")
    finally:
        store.close()
