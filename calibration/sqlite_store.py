"""The single-host calibration store: one SQLite file in WAL mode with synchronous=FULL.

Every write is one ``BEGIN IMMEDIATE`` transaction, durable at COMMIT (synchronous=FULL); WAL lets
readers run beside a writer, and ``busy_timeout`` makes concurrent writers wait, not fail. Fits by
other processes on the same file reach the cache through SQLite's ``data_version``, which changes
when another connection commits: one PRAGMA per lookup, no query.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from calibration.store import (
    DEFAULT_TENANT,
    LEGACY_READ_VERSION,
    RECORDED_LIMIT,
    Calibration,
    CalibrationKey,
    CalibrationStore,
    DecisionRecord,
    check_schema_version,
    key_filter,
    utc_now,
)

# Applied in order, each in the one transaction that records it in schema_migrations.
# Never edit a released entry: add one.
MIGRATIONS: list[tuple[int, str, tuple[str, ...]]] = [
    (1, "calibrations, decisions, feedback", (
        """CREATE TABLE IF NOT EXISTS calibrations (
            id TEXT PRIMARY KEY, model TEXT NOT NULL, revision TEXT NOT NULL, question_type TEXT NOT NULL,
            option_count INTEGER, domain TEXT, temperature REAL NOT NULL, n INTEGER NOT NULL,
            nll_before REAL, nll_after REAL, heldout_n INTEGER, heldout_ece_before REAL, heldout_ece_after REAL,
            source TEXT NOT NULL, fitted_at TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS calibrations_key ON calibrations (model, revision, question_type, option_count, domain, fitted_at)",
        """CREATE TABLE IF NOT EXISTS decisions (
            id TEXT PRIMARY KEY, model TEXT NOT NULL, revision TEXT NOT NULL, question_type TEXT NOT NULL,
            option_count INTEGER NOT NULL, domain TEXT, options TEXT NOT NULL, raw_probabilities TEXT NOT NULL,
            created_at TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS feedback (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, decision_id TEXT NOT NULL REFERENCES decisions (id),
            gold TEXT NOT NULL, received_at TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS feedback_decision ON feedback (decision_id)",
    )),
    (2, "decisions.informative: abstentions are not fitted on", (
        "ALTER TABLE decisions ADD COLUMN informative INTEGER NOT NULL DEFAULT 1",
    )),
    # Rows already stored were read under the first prompt layout: tagged so, kept, and no longer
    # applied to reads of another version. Every insert names the version (the DEFAULT is for them).
    (3, "prompt_version on calibrations and decisions; calibration mode and per-option bias", (
        f"ALTER TABLE calibrations ADD COLUMN prompt_version TEXT NOT NULL DEFAULT '{LEGACY_READ_VERSION}'",
        "ALTER TABLE calibrations ADD COLUMN mode TEXT NOT NULL DEFAULT 'temperature'",
        "ALTER TABLE calibrations ADD COLUMN bias TEXT",
        "ALTER TABLE calibrations ADD COLUMN heldout_ece_floor REAL",
        f"ALTER TABLE decisions ADD COLUMN prompt_version TEXT NOT NULL DEFAULT '{LEGACY_READ_VERSION}'",
    )),
    # The state_prior mode reads a key's latest decisions (``recorded``). Also a version step: an
    # opendecide that cannot read a state_prior calibration refuses this file.
    (4, "decisions by key and time, for state_prior refits; calibration mode state_prior", (
        "CREATE INDEX IF NOT EXISTS decisions_recorded ON decisions (model, revision, prompt_version, question_type, option_count, created_at)",
    )),
    # Names that say what the columns hold: the version of the read (prompt version, +prior where the
    # prior correction was divided out) and the read before calibration. Renames keep every row, and
    # SQLite (3.25+) carries the index above over to the new name.
    (5, "read_version and uncalibrated_probabilities: prompt_version and raw_probabilities renamed; source 'labels' is 'examples'", (
        "ALTER TABLE calibrations RENAME COLUMN prompt_version TO read_version",
        "UPDATE calibrations SET source = 'examples' WHERE source = 'labels'",
        "ALTER TABLE decisions RENAME COLUMN prompt_version TO read_version",
        "ALTER TABLE decisions RENAME COLUMN raw_probabilities TO uncalibrated_probabilities",
    )),
    # Tenants: every row stored before belongs to the default tenant (what every key was). A calibration's
    # NULL tenant is a shared fit. The DEFAULTs also let a replica from before this migration, still
    # running, keep writing as the default tenant; one opened after it refuses the file (roll forward).
    (6, "tenant on calibrations, decisions and feedback; NULL tenant = shared calibration", (
        f"ALTER TABLE calibrations ADD COLUMN tenant TEXT DEFAULT '{DEFAULT_TENANT}'",
        f"ALTER TABLE decisions ADD COLUMN tenant TEXT NOT NULL DEFAULT '{DEFAULT_TENANT}'",
        f"ALTER TABLE feedback ADD COLUMN tenant TEXT NOT NULL DEFAULT '{DEFAULT_TENANT}'",
        "CREATE INDEX IF NOT EXISTS decisions_tenant_recorded ON decisions (tenant, model, revision, read_version, question_type, option_count, created_at)",
    )),
]  # fmt: skip
SCHEMA_VERSION = MIGRATIONS[-1][0]


class SQLiteStore(CalibrationStore):
    """Thread-safe: one connection per thread, all in WAL mode on the same file."""

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._migrate()
        self._refresh()

    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("PRAGMA foreign_keys=ON")
            self._local.db = db
        return db

    def _transaction(self) -> _Transaction:
        return _Transaction(self._connection())

    # -- schema -------------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._transaction() as db:  # BEGIN IMMEDIATE: two processes opening one file migrate once
            db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            applied = {row[0] for row in db.execute("SELECT version FROM schema_migrations")}
            if not applied:
                applied = self._versions_before_migrations(db)
            check_schema_version(max(applied, default=0), SCHEMA_VERSION, str(self.path))
            for version, description, statements in MIGRATIONS:
                if version not in applied:
                    for statement in statements:
                        db.execute(statement)
                    db.execute(
                        "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, description, utc_now())
                    )

    @staticmethod
    def _versions_before_migrations(db: sqlite3.Connection) -> set[int]:
        """Files written before schema_migrations existed. Version 1 creates only what is missing (IF
        NOT EXISTS), so it always runs; versions 2 and 3 are recorded as found when their columns are there."""
        decisions = {row["name"] for row in db.execute("PRAGMA table_info(decisions)")}
        calibrations = {row["name"] for row in db.execute("PRAGMA table_info(calibrations)")}
        found = set()
        for version, present in ((2, "informative" in decisions), (3, "prompt_version" in calibrations)):
            if not present:
                break
            _, description, _ = MIGRATIONS[version - 1]
            db.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                (version, f"{description} (found)", utc_now()),
            )
            found.add(version)
        return found

    def schema_version(self) -> int:
        return self._connection().execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]

    # -- calibrations -------------------------------------------------------------------------

    def _insert_calibration(self, calibration: Calibration) -> int:
        row = calibration.as_json()
        row["bias"] = None if row["bias"] is None else json.dumps(row["bias"])
        with self._transaction() as db:
            cursor = db.execute(
                f"INSERT INTO calibrations ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                list(row.values()),
            )
        return cursor.lastrowid

    def _reload(self) -> None:
        # rowid is the insertion order (rows are never deleted), the same on every connection.
        rows = self._connection().execute("SELECT rowid AS stored, * FROM calibrations").fetchall()
        self._remember((row["stored"], _calibration(row)) for row in rows)

    def _refresh(self) -> None:
        version = self._connection().execute("PRAGMA data_version").fetchone()[0]
        # data_version is per connection: a thread's first look reloads, later ones only on a change.
        if version != getattr(self._local, "seen_version", None):
            self._reload()
        self._local.seen_version = version

    # -- decisions and feedback ---------------------------------------------------------------

    def add_decisions(self, decisions: Iterable[DecisionRecord]) -> None:
        rows = [
            (d.id, d.model, d.revision, d.question_type, d.option_count, d.domain, json.dumps(d.options),
             json.dumps(d.uncalibrated_probabilities), int(d.informative), d.read_version, d.tenant, utc_now())
            for d in decisions
        ]  # fmt: skip
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, "
                "uncalibrated_probabilities, informative, read_version, tenant, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def decision(self, decision_id: str, tenant: str = DEFAULT_TENANT) -> DecisionRecord | None:
        row = (
            self._connection()
            .execute("SELECT * FROM decisions WHERE id = ? AND tenant = ?", (decision_id, tenant))
            .fetchone()
        )
        if row is None:
            return None
        return DecisionRecord(
            row["id"], row["model"], row["revision"], row["question_type"], row["option_count"], row["domain"],
            json.loads(row["options"]), json.loads(row["uncalibrated_probabilities"]), bool(row["informative"]),
            read_version=row["read_version"], tenant=row["tenant"],
        )  # fmt: skip

    def add_feedback(self, decision_id: str, gold: str, tenant: str = DEFAULT_TENANT) -> int:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO feedback (decision_id, gold, tenant, received_at) VALUES (?, ?, ?, ?)",
                (decision_id, gold, tenant, utc_now()),
            )
            return int(cursor.lastrowid)

    def prune_decisions(self, older_than: dt.datetime) -> int:
        cutoff = older_than.astimezone(dt.UTC).isoformat(timespec="microseconds")
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM decisions WHERE created_at < ? AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.decision_id = decisions.id)",
                (cutoff,),
            )
            return int(cursor.rowcount)

    def gold_rows(self, key: CalibrationKey) -> list[tuple[list[float], int]]:
        where, params = key_filter(key, "?")
        query = f"""
            SELECT d.options, d.uncalibrated_probabilities, f.gold FROM feedback f JOIN decisions d ON d.id = f.decision_id AND d.tenant = f.tenant
            WHERE {where} AND d.informative = 1 AND f.seq = (SELECT MAX(seq) FROM feedback WHERE decision_id = f.decision_id AND tenant = f.tenant)
            ORDER BY f.seq
        """
        rows = self._connection().execute(query, params).fetchall()
        return [
            (json.loads(r["uncalibrated_probabilities"]), json.loads(r["options"]).index(r["gold"]))
            for r in rows
        ]

    def recorded(
        self, key: CalibrationKey, limit: int = RECORDED_LIMIT
    ) -> list[tuple[list[str], list[float]]]:
        where, params = key_filter(key, "?")
        query = f"SELECT d.options, d.uncalibrated_probabilities FROM decisions d WHERE {where} AND d.informative = 1 ORDER BY d.created_at DESC, d.rowid DESC LIMIT ?"
        rows = self._connection().execute(query, [*params, limit]).fetchall()
        return [
            (json.loads(row["options"]), json.loads(row["uncalibrated_probabilities"]))
            for row in reversed(rows)
        ]

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:  # sqlite3 connections belong to their thread: this thread's one
            db.close()
            self._local.db = None


def _calibration(row: sqlite3.Row) -> Calibration:
    fields = {k: row[k] for k in row.keys() if k != "stored"}
    fields["bias"] = None if fields["bias"] is None else tuple(json.loads(fields["bias"]))
    return Calibration(**fields)


class _Transaction:
    """``with`` → BEGIN IMMEDIATE … COMMIT (or ROLLBACK): each call is one durable transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, error_type, error, traceback) -> None:
        self.db.execute("ROLLBACK" if error_type else "COMMIT")
