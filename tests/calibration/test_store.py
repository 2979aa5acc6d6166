"""The store contract, run against both backends: a real SQLite file and a real PostgreSQL server.

Lookup order, restart, pickup of fits by another process, migrations, concurrency, crash safety.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg.types.json import Jsonb

from calibration.open import open_store
from calibration.postgres_store import LISTENER_NAME, SCHEMA_VERSION, PostgresStore, migrate
from calibration.probe import ProbeMap, ProbeMember
from calibration.sqlite_store import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from calibration.sqlite_store import SQLiteStore
from calibration.store import (
    LEGACY_READ_VERSION,
    CalibrationKey,
    DecisionRecord,
    SchemaTooNew,
)
from tests.calibration.stores import KEY, VERSION, decision, eventually, query, schema_at

ROOT = Path(__file__).resolve().parents[2]


def test_lookup_takes_the_most_specific_calibration(new_store):
    store = new_store()
    assert store.lookup(KEY) is None
    by_type = store.add_calibration(
        CalibrationKey("smol", "rev1", "choice", read_version=VERSION),
        temperature=2.0,
        n=50,
        source="examples",
    )
    assert store.lookup(KEY) == by_type
    by_count = store.add_calibration(
        CalibrationKey("smol", "rev1", "choice", 3, read_version=VERSION),
        temperature=1.5,
        n=50,
        source="examples",
    )
    assert store.lookup(KEY) == by_count
    by_domain = store.add_calibration(KEY, temperature=1.2, n=50, source="examples")
    assert store.lookup(KEY) == by_domain
    assert (
        store.lookup(CalibrationKey("smol", "rev1", "choice", 3, "other-domain", read_version=VERSION))
        == by_count
    )
    assert (
        store.lookup(CalibrationKey("smol", "rev2", "choice", 3, read_version=VERSION)) is None
    )  # another revision: nothing applies
    newer = store.add_calibration(KEY, temperature=1.1, n=80, source="feedback")
    assert store.lookup(KEY) == newer and store.calibrations() == [by_type, by_count, newer]


def test_a_reopened_store_keeps_calibrations_decisions_and_feedback(new_store, location):
    store = new_store()
    fitted = store.add_calibration(KEY, temperature=1.7, n=60, source="examples", heldout_ece_after=0.05)
    store.add_decisions([decision("d1"), decision("d2")])
    uninformative = DecisionRecord(
        "d3",
        KEY.model,
        KEY.revision,
        KEY.question_type,
        2,
        None,
        ["true", "false"],
        [0.5, 0.5],
        informative=False,
        read_version=VERSION,
    )
    store.add_decisions([uninformative])
    assert store.add_feedback("d1", "b") < store.add_feedback("d2", "c")
    store.close()
    reopened = new_store()
    assert reopened.lookup(KEY) == fitted and reopened.calibrations() == [fitted]
    assert reopened.decision("d1") == decision("d1") and reopened.decision("d3") == uninformative
    assert reopened.decision("nope") is None
    assert reopened.gold_rows(KEY) == [([0.5, 0.3, 0.2], 1), ([0.5, 0.3, 0.2], 2)]


def test_a_probe_fit_and_decisions_hidden_states_survive_a_reopen(new_store):
    """A probe fit (its linear term) and each decision's hidden state come back as stored, in float32;
    gold rows carry the state only when asked, and a decision without one (a vLLM read) has None."""
    store = new_store()
    rng = np.random.default_rng(0)
    probe = ProbeMap.of([
        ProbeMember(1.3, rng.normal(size=3), rng.normal(size=8), rng.uniform(0.5, 2, size=8), rng.normal(size=(3, 8)))
        for _ in range(2)
    ])  # fmt: skip
    fitted = store.add_calibration(
        KEY, temperature=1.3, n=40, source="examples", mode="probe", bias=[0.1, 0.0, -0.1], probe=probe
    )
    state = tuple(float(v) for v in rng.normal(size=8).astype(np.float32))
    store.add_decisions([replace(decision("d1"), features=state), decision("d2")])
    store.add_feedback("d1", "b")
    store.add_feedback("d2", "c")
    store.close()
    reopened = new_store()
    # The lookup cache holds the probe's shape; its weights load on first use, then stay in memory.
    assert reopened.lookup(KEY) == fitted and fitted.probe is None
    assert (fitted.probe_dimension, fitted.probe_members) == (8, 2)
    assert reopened.cached_probe(fitted) is None
    loaded = reopened.load_probe(fitted)
    z, h = rng.normal(size=(4, 3)), rng.normal(size=(4, 8))
    assert np.allclose(loaded.apply(z, h), probe.apply(z, h), atol=1e-6)
    assert reopened.cached_probe(fitted) is loaded
    assert reopened.decision("d1").features == state and reopened.decision("d2").features is None
    assert reopened.gold_rows(KEY) == [([0.5, 0.3, 0.2], 1), ([0.5, 0.3, 0.2], 2)]
    assert reopened.gold_rows(KEY, features=True) == [([0.5, 0.3, 0.2], 1, state), ([0.5, 0.3, 0.2], 2, None)]
    with pytest.raises(ValueError, match="has a probe, and only it"):
        reopened.add_calibration(KEY, temperature=1.0, n=40, source="examples", mode="probe", bias=[0.0] * 3)
    with pytest.raises(ValueError, match="one row per option"):
        reopened.add_calibration(
            KEY, temperature=1.0, n=40, source="examples", mode="probe", bias=[0.0] * 3,
            probe=ProbeMap.of([ProbeMember(1.0, np.zeros(2), np.zeros(8), np.ones(8), np.zeros((2, 8)))]),
        )  # fmt: skip


def test_a_store_told_not_to_record_hidden_states_keeps_none(new_store):
    """``record_features=False`` (decide serve --no-record-hidden-states): the decision and its
    feedback are stored, its hidden state is not, and a probe refit then has nothing to fit on."""
    store = new_store(record_features=False)
    store.add_decisions([replace(decision("d1"), features=(0.5,) * 8)])
    store.add_feedback("d1", "b")
    assert store.decision("d1").features is None
    assert store.gold_rows(KEY, features=True) == [([0.5, 0.3, 0.2], 1, None)]


def test_writes_are_durable_at_commit(new_store, location):
    new_store()
    if location.startswith("postgresql://"):
        settings = dict(
            query(
                location,
                "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')",
            )
        )
        assert settings == {"fsync": "on", "synchronous_commit": "on"}
    else:
        assert query(location, "PRAGMA journal_mode") == [("wal",)]
        db = SQLiteStore(location)._connection()
        assert (
            db.execute("PRAGMA synchronous").fetchone()[0] == 2
        )  # FULL: durable at commit, not only on a clean exit


def test_fits_by_another_process_are_seen_without_a_restart(new_store):
    serving, other = new_store(), new_store()  # two replicas of the service on one store
    assert serving.lookup(KEY) is None
    stored = time.monotonic()
    fitted = other.add_calibration(KEY, temperature=1.3, n=50, source="examples")
    eventually(lambda: serving.lookup(KEY) == fitted)
    print(f"pickup {1000 * (time.monotonic() - stored):.1f} ms")
    refit = other.add_calibration(KEY, temperature=1.4, n=70, source="feedback")
    eventually(lambda: serving.lookup(KEY) == refit)
    assert serving.calibrations() == [refit]


def test_migrations_are_recorded_once(new_store, location):
    first = new_store()
    latest = first.schema_version()
    versions = query(location, "SELECT version FROM schema_migrations ORDER BY version")
    assert [v for (v,) in versions] == list(range(1, latest + 1))
    second = new_store()
    assert second.schema_version() == latest
    assert query(location, "SELECT count(*) FROM schema_migrations") == [(latest,)]


def test_a_store_from_a_newer_version_is_refused(new_store, location):
    new_store().close()
    if location.startswith("postgresql://"):
        with psycopg.connect(location) as db:
            db.execute("INSERT INTO schema_migrations (version, description) VALUES (99, 'from the future')")
    else:
        with sqlite3.connect(location) as db:
            db.execute("INSERT INTO schema_migrations VALUES (99, 'from the future', 'then')")
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        open_store(location)


def test_a_sqlite_file_from_before_the_informative_column_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE decisions (id TEXT PRIMARY KEY, model TEXT NOT NULL, revision TEXT NOT NULL, question_type TEXT NOT NULL, "
        "option_count INTEGER NOT NULL, domain TEXT, options TEXT NOT NULL, raw_probabilities TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    old.execute(
        "INSERT INTO decisions VALUES ('d0', 'smol', 'rev1', 'choice', 3, 'support', '[\"a\", \"b\", \"c\"]', '[0.5, 0.3, 0.2]', 'then')"
    )
    old.commit()
    old.close()
    store = open_store(path)
    store.add_decisions([decision("d1")])
    store.add_feedback("d0", "c")
    store.add_feedback("d1", "a")
    assert store.decision("d0").informative and store.decision("d1") == decision("d1")
    assert store.decision("d0").read_version == LEGACY_READ_VERSION  # read under the first layout
    assert store.gold_rows(KEY) == [([0.5, 0.3, 0.2], 0)]  # d1 only: d0's layout is not this one
    assert store.gold_rows(replace(KEY, read_version=LEGACY_READ_VERSION)) == [([0.5, 0.3, 0.2], 2)]
    assert [
        v for v, _ in query(str(path), "SELECT version, description FROM schema_migrations ORDER BY version")
    ] == list(range(1, SQLITE_SCHEMA_VERSION + 1))


@pytest.mark.integration
def test_a_postgres_database_at_an_earlier_version_is_brought_up(postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as db:
        assert migrate(db, target=1) == 1
        db.execute("INSERT INTO decisions (id, model, revision, question_type, option_count, options, raw_probabilities, informative) "
                   "VALUES ('d0', 'smol', 'rev1', 'choice', 3, '[\"a\", \"b\", \"c\"]', '[0.5, 0.3, 0.2]', true)")  # fmt: skip
    # No polling: only version 2's trigger can tell ``serving`` of the other store's fit in time.
    serving, other = PostgresStore(postgres_url, poll_s=3600), open_store(postgres_url)
    try:
        assert serving.schema_version() == SCHEMA_VERSION and serving.decision("d0").options == [
            "a",
            "b",
            "c",
        ]
        fitted = other.add_calibration(KEY, temperature=1.3, n=50, source="examples")
        eventually(lambda: serving.lookup(KEY) == fitted, timeout_s=5.0)
    finally:
        serving.close()
        other.close()


@pytest.mark.integration
def test_a_listener_that_lost_its_connection_reconnects_and_catches_up(postgres_url):
    serving, other = PostgresStore(postgres_url, poll_s=0.2), open_store(postgres_url)
    try:
        with psycopg.connect(postgres_url, autocommit=True) as admin:

            def listeners() -> set[int]:
                return {
                    pid
                    for (pid,) in admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (LISTENER_NAME,)
                    )
                }

            cut = eventually(lambda: len(listeners()) == 2 and listeners())  # both stores' listeners
            for pid in cut:
                admin.execute(
                    "SELECT pg_terminate_backend(%s)", (pid,)
                )  # as a network cut or a server restart would
            fitted = other.add_calibration(
                KEY, temperature=1.3, n=50, source="examples"
            )  # notified to nobody listening
            eventually(lambda: serving.lookup(KEY) == fitted, timeout_s=10.0)
            eventually(lambda: len(listeners()) == 2 and not listeners() & cut)  # both reconnected
    finally:
        serving.close()
        other.close()


def test_uninformative_reads_are_not_fitted_on(new_store):
    store = new_store()
    uninformative = decision("d0", informative=False)
    store.add_decisions([uninformative, decision("d1")])
    store.add_feedback("d0", "a")
    store.add_feedback("d1", "a")
    assert store.gold_rows(KEY) == [([0.5, 0.3, 0.2], 0)]


def test_latest_feedback_for_a_decision_wins(new_store):
    store = new_store()
    store.add_decisions(
        [
            decision("d1"),
            decision("d2"),
            decision("x", CalibrationKey("smol", "rev1", "choice", 3, "elsewhere", read_version=VERSION)),
        ]
    )
    store.add_feedback("d1", "a")
    store.add_feedback("d2", "c")
    store.add_feedback("x", "c")
    store.add_feedback("d1", "b")  # a correction
    assert store.gold_rows(KEY) == [([0.5, 0.3, 0.2], 2), ([0.5, 0.3, 0.2], 1)]
    assert (
        store.feedback_count(KEY) == 2
        and store.feedback_count(CalibrationKey("smol", "rev1", "choice", 3, read_version=VERSION)) == 3
    )


def test_a_refit_reads_the_latest_gold_answers_and_the_count_is_of_all(new_store):
    """gold_rows returns the latest ``limit`` decisions with feedback (a correction re-dates one),
    oldest first; feedback_count counts every one without reading them."""
    store = new_store()
    read = [[0.125 * i, 0.5, 0.5 - 0.125 * i] for i in range(5)]  # exact in binary: compared as stored
    store.add_decisions([replace(decision(f"d{i}"), uncalibrated_probabilities=read[i]) for i in range(5)])
    for i in range(5):
        store.add_feedback(f"d{i}", "a")
    store.add_feedback("d1", "c")  # d1 is now the latest, and its gold is c
    assert store.feedback_count(KEY) == 5
    assert store.gold_rows(KEY, limit=3) == [(read[3], 0), (read[4], 0), (read[1], 2)]
    assert store.gold_rows(KEY) == [(read[0], 0), (read[2], 0), (read[3], 0), (read[4], 0), (read[1], 2)]
    assert store.gold_rows(KEY, features=True, limit=1) == [(read[1], 2, None)]


def test_pruning_deletes_old_decisions_without_feedback_only(new_store):
    store = new_store()
    store.add_decisions([decision("kept-with-gold"), decision("pruned")])
    store.add_feedback("kept-with-gold", "a")
    now = dt.datetime.now(dt.UTC)
    assert store.prune_decisions(now - dt.timedelta(days=1)) == 0  # both are newer than the cutoff
    assert store.prune_decisions(now + dt.timedelta(seconds=1)) == 1
    assert store.decision("pruned") is None and store.decision("kept-with-gold") is not None
    assert store.gold_rows(KEY) == [([0.5, 0.3, 0.2], 0)]


def test_concurrent_writers_lose_nothing(new_store, location):
    store = new_store()
    store.add_decisions([decision(f"d{i}") for i in range(8)])
    errors, fitted = [], []

    def write(worker: int) -> None:
        try:
            for i in range(50):
                store.add_feedback(f"d{worker}", "a")
                if i % 10 == 0:
                    fitted.append(
                        store.add_calibration(KEY, temperature=1.0 + worker, n=10, source="examples")
                    )
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert query(location, "SELECT count(*) FROM feedback") == [(400,)]
    # 40 fits of one key stored; retention keeps its latest 20, and the latest stored is the one applied.
    order = "seq" if location.startswith("postgresql://") else "rowid"
    kept = [id_ for (id_,) in query(location, f"SELECT id FROM calibrations ORDER BY {order}")]
    assert len({c.id for c in fitted}) == 40 and len(kept) == store.keep_fits == 20
    assert set(kept) <= {c.id for c in fitted} and store.lookup(KEY).id == kept[-1]


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from calibration.open import open_store
    from calibration.store import DecisionRecord
    store = open_store({location!r})
    store.add_decisions([DecisionRecord({name!r}, "smol", "rev1", "noul", 2, None, ["true", "false"], [0.6, 0.4], read_version="decide-prompt/2")])
    print("ready", flush=True)
    i = 0
    while True:
        seq = store.add_feedback({name!r}, "true" if i % 2 else "false")
        print(seq, flush=True)  # acknowledged only after the commit returned
        i += 1
    """
)


@pytest.mark.integration  # three writer processes, killed
def test_every_acknowledged_feedback_survives_a_kill(location):
    """Three writer processes at once; one is killed mid-stream, then the others."""
    names = ["w0", "w1", "w2"]
    writers = {
        name: subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), location=location, name=name)], stdout=subprocess.PIPE, text=True)
        for name in names
    }  # fmt: skip
    acknowledged: dict[str, list[int]] = {name: [] for name in names}

    def read(name: str) -> None:
        for line in writers[name].stdout:
            if line.strip() != "ready":
                acknowledged[name].append(int(line))

    readers = [threading.Thread(target=read, args=(name,)) for name in names]
    for reader in readers:
        reader.start()
    try:
        # All three writing at once (SQLite's lock is not fair, so wait for each), w0 well into its stream.
        eventually(
            lambda: len(acknowledged["w0"]) >= 300 and all(len(acks) >= 20 for acks in acknowledged.values()),
            timeout_s=120,
        )
        writers["w0"].send_signal(signal.SIGKILL)  # mid-stream: w0 is inside its next transaction
        at_kill = {name: len(acknowledged[name]) for name in ("w1", "w2")}
        eventually(
            lambda: all(len(acknowledged[name]) >= at_kill[name] + 100 for name in at_kill), timeout_s=120
        )  # the others go on
        for name in ("w1", "w2"):
            writers[name].send_signal(signal.SIGKILL)
        for name in names:
            assert writers[name].wait(timeout=30) == -signal.SIGKILL
        for reader in readers:
            reader.join(timeout=30)
    finally:
        for writer in writers.values():
            if writer.poll() is None:  # a failed wait above: no writer outlives the test
                writer.kill()
    for name in names:
        stored = {seq for (seq,) in query(location, f"SELECT seq FROM feedback WHERE decision_id = '{name}'")}
        assert set(acknowledged[name]) <= stored, name
    open_store(location).close()  # and it still opens as a store


def test_openers_of_one_new_sqlite_file_all_open_it(tmp_path):
    """Six openers of one new file at once (workers starting together): switching the new file to WAL
    can be refused at once as "database is locked", which the store waits out instead of failing.
    Before it did, about one round in ten lost an opener."""

    def open_it(path: Path, start: threading.Barrier, errors: list[BaseException]) -> None:
        start.wait()
        try:
            SQLiteStore(path, poll_s=60).close()
        except Exception as error:
            errors.append(error)

    for round_ in range(60):
        path = tmp_path / f"new-{round_}.sqlite3"
        start = threading.Barrier(6)
        errors: list[BaseException] = []
        openers = [threading.Thread(target=open_it, args=(path, start, errors)) for _ in range(6)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join()
        assert not errors, (round_, errors)
        assert query(str(path), "PRAGMA journal_mode") == [("wal",)]


def test_a_sqlite_file_from_before_schema_migrations_keeps_its_data(tmp_path):
    """A file the store wrote before it recorded migrations (version 3's columns, no schema_migrations)."""
    path = str(tmp_path / "before.sqlite3")
    schema_at(path, 3, recorded=False)
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, fitted_at, prompt_version) "
            "VALUES ('cal_1', 'smol', 'rev1', 'choice', 3, 'support', 1.3, 50, 'examples', '2026-11-01T00:00:00.000000+00:00', ?)",
            (VERSION,),
        )
        db.execute(
            "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, raw_probabilities, prompt_version, created_at) "
            "VALUES ('d1', 'smol', 'rev1', 'choice', 3, 'support', '[\"a\", \"b\", \"c\"]', '[0.5, 0.3, 0.2]', ?, 'then')",
            (VERSION,),
        )
        db.execute("INSERT INTO feedback (decision_id, gold, received_at) VALUES ('d1', 'b', 'then')")
    reopened = open_store(path)
    assert reopened.lookup(KEY).id == "cal_1" and reopened.gold_rows(KEY) == [([0.5, 0.3, 0.2], 1)]
    assert reopened.decision("d1") == decision("d1")
    assert query(path, "SELECT version, description FROM schema_migrations ORDER BY version") == [
        (1, "calibrations, decisions, feedback"), (2, "decisions.informative: abstentions are not fitted on (found)"),
        (3, "prompt_version on calibrations and decisions; calibration mode and per-option bias (found)"),
        (4, "decisions by key and time, for state_prior refits; calibration mode state_prior"),
        (5, "read_version and uncalibrated_probabilities: prompt_version and raw_probabilities renamed; source 'labels' is 'examples'"),
        (6, "tenant on calibrations, decisions and feedback; NULL tenant = shared calibration"),
        (7, "calibrations by whole key, newest first: retention of superseded fits"),
        (8, "calibrations.mode_chosen_by: caller or default; calibration mode affine"),
        (9, "calibrations.probe and decisions.features: calibration mode probe"),
    ]  # fmt: skip


def at_version_2(location: str) -> None:
    """A store as opendecide left it before prompt versions were recorded: schema version 2, one
    committed temperature fit and one decision with feedback, written with that version's columns."""
    schema_at(location, 2)
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True) as db:
            db.execute("INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, fitted_at) "
                       "VALUES ('cal_old', 'smol', 'rev1', 'choice', 3, 'support', 1.9, 60, 'examples', now())")  # fmt: skip
            db.execute("INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, raw_probabilities, informative) "
                       "VALUES ('d0', 'smol', 'rev1', 'choice', 3, 'support', '[\"a\", \"b\", \"c\"]', '[0.5, 0.3, 0.2]', true)")  # fmt: skip
            db.execute("INSERT INTO feedback (decision_id, gold) VALUES ('d0', 'c')")
        return
    with sqlite3.connect(location) as db:
        db.execute("INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, fitted_at) "
                   "VALUES ('cal_old', 'smol', 'rev1', 'choice', 3, 'support', 1.9, 60, 'examples', '2026-11-01T00:00:00.000000+00:00')")  # fmt: skip
        db.execute("INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, raw_probabilities, created_at) "
                   "VALUES ('d0', 'smol', 'rev1', 'choice', 3, 'support', '[\"a\", \"b\", \"c\"]', '[0.5, 0.3, 0.2]', 'then')")  # fmt: skip
        db.execute("INSERT INTO feedback (decision_id, gold, received_at) VALUES ('d0', 'c', 'then')")


PRIOR_VERSION = "decide-prompt/4+prior"  # a read version with the prior correction's mark


def at_version_4(location: str) -> None:
    """A store as opendecide left it before ``read_version`` and ``uncalibrated_probabilities``
    (schema version 4: ``prompt_version``, ``raw_probabilities``): a temperature_bias fit on the
    domain key and a later state_prior fit on the type + count key; a decision with two feedbacks
    (the second a correction), an abstention with feedback, and a later decision without feedback."""
    schema_at(location, 4)
    postgres = location.startswith("postgresql://")
    mark = "%s" if postgres else "?"
    calibrations = [
        (
            "cal_bias",
            "support",
            1.4,
            "temperature_bias",
            [0.2, -0.1, -0.1],
            0.03,
            "2026-11-01T00:00:00+00:00",
        ),
        ("cal_prior", None, 1.0, "state_prior", [0.5, -0.25, -0.25], None, "2026-11-02T00:00:00+00:00"),
    ]
    decisions = [
        ("d0", [0.5, 0.3, 0.2], True, "2026-11-01T00:00:00+00:00"),
        ("d1", [1 / 3] * 3, False, "2026-11-01T00:00:01+00:00"),
        ("d2", [0.1, 0.1, 0.8], True, "2026-11-01T00:00:02+00:00"),
    ]
    with psycopg.connect(location, autocommit=True) if postgres else sqlite3.connect(location) as db:
        for id_, domain, temperature, mode, bias, floor, fitted_at in calibrations:
            db.execute(
                "INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, fitted_at, "
                f"prompt_version, mode, bias, heldout_ece_floor) VALUES ('{id_}', 'smol', 'rev1', 'choice', 3, {mark}, {mark}, 40, "
                f"'labels', {mark}, {mark}, {mark}, {mark}, {mark})",  # a fit from examples, as version 4 named it
                (domain, temperature, fitted_at, PRIOR_VERSION, mode, bias if postgres else json.dumps(bias), floor),
            )  # fmt: skip
        for id_, probabilities, informative, created_at in decisions:
            options, probabilities = (
                (Jsonb(["a", "b", "c"]), Jsonb(probabilities)) if postgres
                else (json.dumps(["a", "b", "c"]), json.dumps(probabilities))
            )  # fmt: skip
            db.execute(
                "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, raw_probabilities, "
                f"informative, prompt_version, created_at) VALUES ('{id_}', 'smol', 'rev1', 'choice', 3, 'support', {mark}, {mark}, "
                f"{mark}, {mark}, {mark})",
                (options, probabilities, informative, PRIOR_VERSION, created_at),
            )  # fmt: skip
        for decision_id, gold in (("d0", "a"), ("d1", "b"), ("d0", "c")):
            db.execute(
                f"INSERT INTO feedback (decision_id, gold, received_at) VALUES ({mark}, {mark}, {mark})",
                (decision_id, gold, "2026-11-03T00:00:00+00:00"),
            )


def test_a_store_at_version_4_keeps_every_row_under_the_new_column_names(new_store, location):
    at_version_4(location)
    counts = {
        table: query(location, f"SELECT count(*) FROM {table}")
        for table in ("calibrations", "decisions", "feedback")
    }
    store = new_store()
    assert store.schema_version() == (
        SCHEMA_VERSION if location.startswith("postgresql://") else SQLITE_SCHEMA_VERSION
    )
    assert {table: query(location, f"SELECT count(*) FROM {table}") for table in counts} == counts
    for table in ("calibrations", "decisions"):
        if location.startswith("postgresql://"):
            sql = f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}'"
        else:
            sql = f"SELECT name FROM pragma_table_info('{table}')"
        names = {name for (name,) in query(location, sql)}
        assert "read_version" in names and not names & {"prompt_version", "raw_probabilities"}, table
    key = replace(KEY, read_version=PRIOR_VERSION)
    by_domain, by_count = store.calibrations()
    assert by_domain.source == by_count.source == "examples"
    assert (by_domain.id, by_domain.read_version, by_domain.mode, by_domain.bias, by_domain.temperature, by_domain.heldout_ece_floor) == (
        "cal_bias", PRIOR_VERSION, "temperature_bias", (0.2, -0.1, -0.1), 1.4, 0.03
    )  # fmt: skip
    assert (by_count.id, by_count.read_version, by_count.mode, by_count.bias, by_count.domain) == (
        "cal_prior", PRIOR_VERSION, "state_prior", (0.5, -0.25, -0.25), None
    )  # fmt: skip
    assert store.lookup(key) == by_domain and store.lookup(replace(key, domain="elsewhere")) == by_count
    assert store.lookup(KEY) is None  # the +prior reads' fits stay theirs
    first = store.decision("d0")
    assert (first.uncalibrated_probabilities, first.read_version, first.informative) == (
        [0.5, 0.3, 0.2],
        PRIOR_VERSION,
        True,
    )
    assert store.decision("d1").informative is False
    assert store.gold_rows(key) == [([0.5, 0.3, 0.2], 2)]  # d0's correction wins; the abstention is left out
    assert store.recorded(key) == [(["a", "b", "c"], [0.5, 0.3, 0.2]), (["a", "b", "c"], [0.1, 0.1, 0.8])]
    store.add_feedback("d2", "c")  # and the renamed columns take new writes
    store.add_decisions([replace(decision("d3"), read_version=PRIOR_VERSION)])
    store.add_feedback("d3", "a")
    assert store.gold_rows(key) == [([0.5, 0.3, 0.2], 2), ([0.1, 0.1, 0.8], 2), ([0.5, 0.3, 0.2], 0)]


def test_committed_calibrations_survive_the_prompt_version_migration_and_stop_applying(new_store, location):
    at_version_2(location)
    store = new_store()
    legacy_key = replace(KEY, read_version=LEGACY_READ_VERSION)
    (old,) = store.calibrations()
    assert (old.id, old.temperature, old.read_version, old.mode, old.bias) == (
        "cal_old",
        1.9,
        LEGACY_READ_VERSION,
        "temperature",
        None,
    )
    assert store.lookup(legacy_key) == old  # kept, under the version it was made under
    assert store.lookup(KEY) is None  # and never applied to reads of another layout
    assert store.gold_rows(KEY) == [] and store.gold_rows(legacy_key) == [([0.5, 0.3, 0.2], 2)]
    new = store.add_calibration(KEY, temperature=1.2, n=50, source="examples")
    assert store.lookup(KEY) == new and store.lookup(legacy_key) == old
    store.close()
    assert {c.id for c in new_store().calibrations()} == {"cal_old", new.id}


def test_recorded_gives_the_latest_informative_decisions_of_a_key_with_or_without_feedback(new_store):
    store = new_store()
    other = CalibrationKey("smol", "rev1", "choice", 3, "elsewhere", read_version=VERSION)
    uninformative = decision("d0", informative=False)
    store.add_decisions([uninformative, decision("d1"), decision("x", other)])
    later = DecisionRecord(
        "d2",
        KEY.model,
        KEY.revision,
        KEY.question_type,
        KEY.option_count,
        KEY.domain,
        ["a", "b", "c"],
        [0.1, 0.1, 0.8],
        read_version=VERSION,
    )
    store.add_decisions([later])
    store.add_feedback("d1", "a")
    options = ["a", "b", "c"]
    assert store.recorded(KEY) == [
        (options, [0.5, 0.3, 0.2]),
        (options, [0.1, 0.1, 0.8]),
    ]  # oldest first; the abstention and the other domain left out
    assert store.recorded(KEY, limit=1) == [(options, [0.1, 0.1, 0.8])]  # the latest
    assert (
        len(store.recorded(CalibrationKey("smol", "rev1", "choice", 3, read_version=VERSION))) == 3
    )  # any domain


def test_a_state_prior_calibration_carries_a_bias(new_store):
    store = new_store()
    fitted = store.add_calibration(
        KEY, temperature=1.0, n=40, source="states", mode="state_prior", bias=[0.5, -0.25, -0.25]
    )
    assert new_store().lookup(KEY) == fitted and fitted.bias == (0.5, -0.25, -0.25)
    with pytest.raises(ValueError, match="has a bias"):
        store.add_calibration(KEY, temperature=1.0, n=40, source="states", mode="state_prior")


def test_a_temperature_bias_calibration_round_trips(new_store):
    store = new_store()
    fitted = store.add_calibration(
        KEY,
        temperature=1.5,
        n=50,
        source="examples",
        mode="temperature_bias",
        bias=[0.25, -0.5, 0.25],
        heldout_ece_floor=0.04,
    )
    store.close()
    again = new_store().lookup(KEY)
    assert again == fitted and again.bias == (0.25, -0.5, 0.25) and again.heldout_ece_floor == 0.04
    with pytest.raises(ValueError, match="one value per option"):
        new_store().add_calibration(
            KEY, temperature=1.0, n=50, source="examples", mode="temperature_bias", bias=[0.1, -0.1]
        )
    with pytest.raises(ValueError, match="mode is one of"):
        new_store().add_calibration(KEY, temperature=1.0, n=50, source="examples", mode="platt")


def test_who_chose_the_mode_round_trips(new_store):
    store = new_store()
    named = store.add_calibration(KEY, temperature=1.2, n=40, source="examples")
    defaulted = store.add_calibration(
        replace(KEY, domain="other"),
        temperature=0.9,
        n=40,
        source="feedback",
        mode="temperature_bias",
        bias=[0.1, 0.0, -0.1],
        mode_chosen_by="default",
    )
    store.close()
    reopened = new_store()  # read back from the backend, not this process's cache
    assert reopened.lookup(KEY) == named and named.mode_chosen_by == "caller"  # add_calibration's default
    assert (
        reopened.lookup(replace(KEY, domain="other")) == defaulted and defaulted.mode_chosen_by == "default"
    )
    assert defaulted.as_json()["mode_chosen_by"] == "default"
    with pytest.raises(ValueError, match="mode_chosen_by is one of caller, default"):
        reopened.add_calibration(KEY, temperature=1.0, n=40, source="examples", mode_chosen_by="server")


def test_fits_from_before_mode_chosen_by_are_the_callers(new_store, location):
    """A store at schema 7 (fits in the mode their request named or the old default, temperature)
    comes up with every fit marked ``caller``, so feedback refits keep the modes they had."""
    schema_at(location, 7)
    postgres = location.startswith("postgresql://")
    mark = "%s" if postgres else "?"
    with psycopg.connect(location, autocommit=True) if postgres else sqlite3.connect(location) as db:
        for id_, domain, mode, bias in (
            ("cal_t", "support", "temperature", None),
            ("cal_b", None, "temperature_bias", [0.2, -0.1, -0.1]),
        ):
            db.execute(
                "INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, "
                f"fitted_at, read_version, mode, bias, tenant) VALUES ({mark}, 'smol', 'rev1', 'choice', 3, {mark}, 1.3, 40, "
                f"'examples', {mark}, {mark}, {mark}, {mark}, 'default')",
                (id_, domain, "2026-11-01T00:00:00+00:00", VERSION, mode, bias if postgres or bias is None else json.dumps(bias)),
            )  # fmt: skip
    store = new_store()
    assert store.schema_version() == (SCHEMA_VERSION if postgres else SQLITE_SCHEMA_VERSION) == 9
    assert {(c.id, c.mode, c.mode_chosen_by) for c in store.calibrations()} == {
        ("cal_t", "temperature", "caller"),
        ("cal_b", "temperature_bias", "caller"),
    }
    # A replica from schema 7, still running during the roll forward, names no mode_chosen_by: its
    # fits are made in named modes or temperature, the caller's as the rows above.
    with psycopg.connect(location, autocommit=True) if postgres else sqlite3.connect(location) as db:
        db.execute(
            "INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, "
            f"fitted_at, read_version, mode, tenant) VALUES ('cal_late', 'smol', 'rev1', 'choice', 3, 'late', 1.1, 40, "
            f"'feedback', {mark}, {mark}, 'temperature', 'default')",
            ("2026-11-02T00:00:00+00:00", VERSION),
        )  # fmt: skip
    assert new_store().lookup(replace(KEY, domain="late")).mode_chosen_by == "caller"
