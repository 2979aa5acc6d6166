"""Tenants in the store, on a real SQLite file and a real PostgreSQL server: each tenant reads only its
own decisions, feedback and fits (then the shared ones); a store from before tenants (schema 5) rolls
forward with every row the default tenant's; an opendecide from before refuses the migrated store."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import psycopg
import pytest
from psycopg.types.json import Jsonb

from calibration import postgres_store, sqlite_store
from calibration.open import open_store
from calibration.store import DEFAULT_TENANT, SchemaTooNew
from tests.calibration.stores import KEY, VERSION, decision, query, schema_at

A, B = replace(KEY, tenant="a"), replace(KEY, tenant="b")


def test_each_tenant_reads_only_its_own_decisions_feedback_and_fits(new_store):
    store = new_store()
    store.add_decisions([replace(decision("a1", A), tenant="a"), replace(decision("b1", B), tenant="b")])
    assert store.decision("a1", "a") is not None and store.decision("a1", "b") is None
    assert store.decision("b1", "b").tenant == "b" and store.decision("b1") is None  # nor the default tenant
    store.add_feedback("a1", "b", "a")
    store.add_feedback("b1", "c", "b")
    store.add_feedback("a1", "c", "b")  # a row naming a's decision as b's: never read as anybody's gold
    assert store.gold_rows(A) == [([0.5, 0.3, 0.2], 1)] and store.gold_rows(B) == [([0.5, 0.3, 0.2], 2)]
    assert [options for options, _ in store.recorded(A)] == [["a", "b", "c"]]

    shared = store.add_calibration(KEY.as_shared(), temperature=3.0, n=20, source="examples")
    assert shared.shared and store.lookup(A) == shared and store.lookup(B) == shared
    own = store.add_calibration(replace(A, domain=None), temperature=2.0, n=20, source="examples")
    # a's own type + count fit comes before the shared domain fit; b still falls back on the shared one
    assert store.lookup(A) == own and store.lookup(B) == shared
    assert store.calibrations(visible_to="a") == [shared, own] and store.calibrations(visible_to="b") == [
        shared
    ]
    reopened = new_store()  # what another replica reads from the database, not this one's cache
    assert reopened.lookup(A) == own and reopened.lookup(B) == shared
    assert reopened.lookup(replace(KEY, tenant="c")) == shared
    with pytest.raises(ValueError, match="shared fits hold no decisions"):
        store.gold_rows(KEY.as_shared())


def at_version_5(where: str) -> None:
    """A store as the opendecide before tenants left it: a fit, two decisions, feedback."""
    schema_at(where, 5)
    postgres = where.startswith("postgresql://")
    mark = "%s" if postgres else "?"
    options, read = (
        (Jsonb(["a", "b", "c"]), Jsonb([0.5, 0.3, 0.2])) if postgres else (json.dumps(["a", "b", "c"]), "[0.5, 0.3, 0.2]")
    )  # fmt: skip
    with psycopg.connect(where, autocommit=True) if postgres else sqlite3.connect(where) as db:
        db.execute(
            "INSERT INTO calibrations (id, model, revision, question_type, option_count, domain, temperature, n, source, "
            f"fitted_at, read_version) VALUES ('cal_old', 'smol', 'rev1', 'choice', 3, 'support', 1.5, 40, 'examples', {mark}, {mark})",
            ("2026-11-01T00:00:00+00:00", VERSION),
        )
        for id_ in ("d0", "d1"):
            db.execute(
                "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, "
                f"uncalibrated_probabilities, informative, read_version, created_at) VALUES ('{id_}', 'smol', 'rev1', "
                f"'choice', 3, 'support', {mark}, {mark}, {mark}, {mark}, {mark})",
                (options, read, True, VERSION, "2026-11-02T00:00:00+00:00"),
            )
        db.execute(
            f"INSERT INTO feedback (decision_id, gold, received_at) VALUES ('d1', 'b', {mark})",
            ("2026-11-03T00:00:00+00:00",),
        )


def test_a_store_from_before_tenants_rolls_forward_as_the_default_tenant(new_store, location):
    at_version_5(location)
    store = new_store()
    backend = postgres_store if location.startswith("postgresql://") else sqlite_store
    assert store.schema_version() == backend.SCHEMA_VERSION  # past 6, the tenants' migration
    (old,) = store.calibrations()
    assert old.id == "cal_old" and old.tenant == DEFAULT_TENANT and not old.shared
    assert store.lookup(KEY) == old and store.lookup(A) is None  # the default tenant's, nobody else's
    assert store.decision("d1").tenant == DEFAULT_TENANT and store.decision("d1", "a") is None
    assert store.gold_rows(KEY) == [([0.5, 0.3, 0.2], 1)] and store.gold_rows(A) == []
    assert query(location, "SELECT DISTINCT tenant FROM feedback") == [(DEFAULT_TENANT,)]


def test_a_replica_from_before_tenants_keeps_writing_as_the_default_tenant(new_store, location):
    new_store()  # migrated to 6
    # the writes an opendecide at schema 5, already running, makes: no tenant column named
    postgres = location.startswith("postgresql://")
    mark = "%s" if postgres else "?"
    with psycopg.connect(location, autocommit=True) if postgres else sqlite3.connect(location) as db:
        db.execute(
            "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, "
            f"uncalibrated_probabilities, informative, read_version, created_at) VALUES ('d9', 'smol', 'rev1', "
            f"'choice', 3, 'support', {mark}, {mark}, {mark}, {mark}, {mark})",
            (
                *((Jsonb(["a", "b", "c"]), Jsonb([0.5, 0.3, 0.2])) if postgres else ('["a", "b", "c"]', "[0.5, 0.3, 0.2]")),
                True, VERSION, "2026-11-02T00:00:00+00:00",
            ),
        )  # fmt: skip
    assert new_store().decision("d9").tenant == DEFAULT_TENANT


def test_an_opendecide_from_before_tenants_refuses_the_migrated_store(new_store, location, monkeypatch):
    new_store()  # migrated to 6 and past
    backend = postgres_store if location.startswith("postgresql://") else sqlite_store
    latest = backend.SCHEMA_VERSION
    # What the release before knew: migrations 1-5. Its check is this code's check.
    monkeypatch.setattr(backend, "MIGRATIONS", backend.MIGRATIONS[:5])
    monkeypatch.setattr(backend, "SCHEMA_VERSION", 5)
    with pytest.raises(
        SchemaTooNew, match=f"schema version {latest}; this opendecide knows up to 5: upgrade it"
    ):
        open_store(location)
