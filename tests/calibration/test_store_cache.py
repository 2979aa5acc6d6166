"""The calibration cache and retention, on both backends (a real SQLite file, a real PostgreSQL server).

Lookups read memory only, whatever other threads and processes commit; the refresh that brings other
processes' fits in reads only the rows stored since the last one it saw; each key keeps its latest
``keep_fits`` fits, and its latest is never deleted.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from calibration.open import open_store
from calibration.postgres_store import CALIBRATION_LOCK, PostgresStore
from calibration.store import CalibrationKey, CalibrationStore
from tests.calibration.stores import KEY, VERSION, counting_store, decision, eventually, query

BY_COUNT = CalibrationKey("smol", "rev1", "choice", 3, read_version=VERSION)


def fit(store: CalibrationStore, key: CalibrationKey = KEY, n: int = 50):
    return store.add_calibration(key, temperature=1.0 + n / 100, n=n, source="examples")


def test_lookup_never_touches_the_database_while_others_commit(new_store, location):
    writer = new_store()
    first = fit(writer)
    store = counting_store(location)
    try:
        me = threading.get_ident()
        at_open = store.connections_by.count(me)  # opening migrates and loads on this thread
        stop = threading.Event()

        def record(worker: int) -> None:  # this process's other threads writing decisions
            i = 0
            while not stop.is_set():
                store.add_decisions([decision(f"w{worker}-{i}")])
                i += 1

        threads = [threading.Thread(target=record, args=(w,)) for w in range(2)]
        for thread in threads:
            thread.start()
        try:
            assert store.lookup(KEY) == first
            refit = fit(writer, n=70)  # another store object on the same database: another process
            looked = 0
            while store.lookup(KEY) != refit:  # brought in by the background refresh, not by lookup
                looked += 1
                assert looked < 10_000_000, "refit not seen"
            for _ in range(1000):
                assert store.lookup(KEY) == refit and store.lookup(replace(KEY, domain="other")) is None
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert store.connections_by.count(me) == at_open
        assert len(store.connections_by) > at_open  # the writers' own calls did take connections
    finally:
        store.close()


def test_a_refresh_reads_only_the_rows_stored_since_the_last_one_seen(new_store, location):
    writer = new_store()
    for n in range(30):
        fit(writer, replace(KEY, domain=f"d{n}"), n=n + 10)  # 30 keys: retention keeps every one
    store = counting_store(location)
    try:
        assert store.rows_read == 30  # the first load reads what is there
        latest = [fit(writer, n=n) for n in (60, 61, 62)]
        eventually(lambda: store.lookup(KEY) == latest[-1])
        refreshes = store.refreshes
        eventually(lambda: store.refreshes >= refreshes + 3)  # polls that find nothing new
        assert store.rows_read == 33  # each stored row read once: never the table again
        assert len(store.calibrations()) == 31
    finally:
        store.close()


def test_each_key_keeps_its_latest_fits_and_never_its_latest_one(new_store, location):
    store = open_store(location, keep_fits=3)
    try:
        mine = [fit(store, n=n) for n in range(10, 15)]
        others = [fit(store, replace(KEY, tenant="a"), n=n) for n in range(10, 12)]
        shared = [fit(store, KEY.as_shared(), n=n) for n in range(10, 15)]  # a NULL tenant is a key too
        by_count = [fit(store, BY_COUNT, n=n) for n in range(10, 14)]  # and a NULL domain
        order = "seq" if location.startswith("postgresql://") else "rowid"
        stored = [id_ for (id_,) in query(location, f"SELECT id FROM calibrations ORDER BY {order}")]
        kept = [*mine[-3:], *others, *shared[-3:], *by_count[-3:]]
        assert sorted(stored) == sorted(c.id for c in kept)
        assert store.lookup(KEY) == mine[-1] and store.lookup(replace(KEY, tenant="a")) == others[-1]
        assert store.lookup(replace(KEY, tenant="b")) == shared[-1]
        assert store.lookup(replace(KEY, domain="elsewhere")) == by_count[-1]
    finally:
        store.close()
    again = new_store()  # a fresh cache, loaded from what is left
    assert again.lookup(KEY) == mine[-1] and again.lookup(replace(KEY, domain="x")) == by_count[-1]
    newest = fit(again, n=99)  # stored after the deletions: still the key's latest, here and reopened
    assert again.lookup(KEY) == newest and new_store().lookup(KEY) == newest


def test_pruning_catches_up_a_store_kept_before_retention(new_store, location):
    before = open_store(location, keep_fits=100)  # as a store from before retention left them
    try:
        mine = [fit(before, n=n) for n in range(10, 16)]
        by_count = [fit(before, BY_COUNT, n=n) for n in range(10, 14)]
    finally:
        before.close()
    store = open_store(location, keep_fits=2)
    try:
        assert store.prune_calibrations() == 4 + 2 and store.prune_calibrations() == 0
        assert sorted(id_ for (id_,) in query(location, "SELECT id FROM calibrations")) == sorted(
            c.id for c in [*mine[-2:], *by_count[-2:]]
        )
        assert store.lookup(KEY) == mine[-1] and new_store().lookup(KEY) == mine[-1]
    finally:
        store.close()


def test_a_store_keeps_at_least_the_latest_fit(location):
    with pytest.raises(ValueError, match="keep_fits must be at least 1"):
        open_store(location, keep_fits=0)


@pytest.mark.integration
def test_postgres_inserts_of_fits_take_turns_so_sequence_order_is_commit_order(postgres_url):
    """The incremental refresh is exact only if no fit commits after one with a later ``seq``: an insert
    waits for the lock another transaction holds, and draws its number after that one committed."""
    import psycopg

    store = PostgresStore(postgres_url)
    try:
        with psycopg.connect(postgres_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (CALIBRATION_LOCK,))
            done: list = []
            inserting = threading.Thread(target=lambda: done.append(fit(store)))
            inserting.start()
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            eventually(lambda: query(postgres_url, waiting) == [(1,)])
            assert not done and query(postgres_url, "SELECT count(*) FROM calibrations") == [(0,)]
            holder.execute("SELECT pg_advisory_unlock(%s)", (CALIBRATION_LOCK,))
            inserting.join()
        assert store.lookup(KEY) == done[0]
    finally:
        store.close()
