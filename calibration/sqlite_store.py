"""The single-host calibration store: one SQLite file in WAL mode with synchronous=FULL.

Every write is one ``BEGIN IMMEDIATE`` transaction, durable at COMMIT (synchronous=FULL); WAL lets
readers run beside a writer, and ``busy_timeout`` makes concurrent writers wait, not fail.

Fits by other processes on the same file reach the cache within ``poll_s``: a background thread
runs ``refresh``, ``SELECT … WHERE rowid > last seen`` (a seek on the rowid b-tree, so its cost is
the new rows, not the table). The rowid is the insertion order, and SQLite has one writer at a time,
assigning rowids inside the write transaction: rowid order is commit order, so a row below the last
one seen can never commit later and be missed. Lookups never touch the file: before this, each one
compared ``PRAGMA data_version`` (changed by every commit of any other connection, this process's
decision writes included) and then re-read the whole calibrations table on the calling thread.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

from calibration.probe import ProbeMap, stored_features
from calibration.probe_cache import ProbeCache
from calibration.store import (
    CALIBRATION_KEY_COLUMNS,
    DEFAULT_TENANT,
    GOLD_LIMIT,
    KEEP_FITS,
    LEGACY_READ_VERSION,
    RECORDED_LIMIT,
    Calibration,
    CalibrationKey,
    CalibrationStore,
    DecisionRecord,
    calibration_filter,
    check_schema_version,
    gold_filter,
    key_filter,
    utc_now,
)

logger = logging.getLogger("opendecide.store")

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
    # Retention keeps each key's latest fits and deletes the rest as a new one is stored: it finds a
    # key's fits newest first by this index (its entries end in the rowid), whatever the table's size.
    (7, "calibrations by whole key, newest first: retention of superseded fits", (
        "CREATE INDEX IF NOT EXISTS calibrations_latest ON calibrations (tenant, model, revision, read_version, question_type, option_count, domain)",
    )),
    # Who chose a fit's mode, so a refit from feedback keeps a mode the caller named and re-applies
    # the defaults (calibration.fit.DEFAULT_MODES) only to a fit that got them. Rows already stored are
    # 'caller': each was fitted in the mode its request named or in the old fixed default, temperature,
    # and refits kept that mode, so 'caller' keeps every stored key answering and refitting as it did,
    # while 'default' would move keys whose caller chose temperature on purpose to temperature_bias at
    # 32 answers, the silent switch this column exists to prevent; a caller who wants the defaults refits
    # once without a mode. The DEFAULT stays for the same reason: a replica from before, still running
    # during a roll forward, fits only in named modes or temperature. Also a version step for the
    # affine mode: a replica from before cannot render an affine fit, and refuses a store at version 8.
    (8, "calibrations.mode_chosen_by: caller or default; calibration mode affine", (
        "ALTER TABLE calibrations ADD COLUMN mode_chosen_by TEXT NOT NULL DEFAULT 'caller'",
    )),
    # The probe mode (calibration.probe): its linear term on the answer slot's hidden state, and each
    # decision's hidden state for refits from feedback (base64 float32, calibration.probe.encode_floats;
    # ~3 KB per decision on SmolLM2-135M). NULL for every row before: their keys' fits are unchanged, and
    # a probe refit fits on the decisions that have one. A version step too: a replica from before
    # cannot apply a probe fit, and refuses a store at version 9.
    (9, "calibrations.probe and decisions.features: calibration mode probe", (
        "ALTER TABLE calibrations ADD COLUMN probe TEXT",
        "ALTER TABLE decisions ADD COLUMN features TEXT",
    )),
]  # fmt: skip
SCHEMA_VERSION = MIGRATIONS[-1][0]


POLL_S = 0.25
"""How often the background thread looks for fits stored by other processes: an index seek that finds
nothing costs microseconds, so a short wait costs nothing worth saving."""


BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another's lock before it fails


def _into_wal(db: sqlite3.Connection) -> None:
    """Put the file in WAL mode, waiting up to ``BUSY_TIMEOUT_S`` for other openers.

    Switching a new file's journal needs its exclusive lock, and SQLite answers "database is locked"
    at once, without waiting in its busy handler, when another connection opening the same file holds
    the shared lock it would have to wait on (two waiting on each other would deadlock). Several
    processes or threads opening one new file together hit this, so retry here until the timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class SQLiteStore(CalibrationStore):
    """Thread-safe: one connection per thread, all in WAL mode on the same file; one more thread
    (``opendecide-store-poller``) refreshes the cache every ``poll_s``."""

    def __init__(
        self,
        path: Path | str,
        *,
        poll_s: float = POLL_S,
        keep_fits: int = KEEP_FITS,
        probe_cache: ProbeCache | None = None,
        record_features: bool = True,
    ) -> None:
        super().__init__(keep_fits=keep_fits, probe_cache=probe_cache, record_features=record_features)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s
        self._local = threading.local()
        self._seen = 0  # the last rowid merged into the cache
        self._refresh_lock = threading.Lock()
        self._migrate()
        self.refresh()
        self._closing = threading.Event()
        # The thread holds the store weakly: a store dropped without close() stops being polled.
        self._poller = threading.Thread(
            target=_poll,
            args=(weakref.ref(self), self._closing, poll_s),
            name="opendecide-store-poller",
            daemon=True,
        )
        self._poller.start()

    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            db.row_factory = sqlite3.Row
            _into_wal(db)
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
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
        where, params = calibration_filter(calibration.key, "?")
        with self._transaction() as db:
            stored = db.execute(
                f"INSERT INTO calibrations ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                list(row.values()),
            ).lastrowid
            # Older than the key's keep_fits-th newest (NULL, deleting nothing, while it has fewer).
            db.execute(
                f"DELETE FROM calibrations WHERE {where} AND rowid < "
                f"(SELECT rowid FROM calibrations WHERE {where} ORDER BY rowid DESC LIMIT 1 OFFSET ?)",
                [*params, *params, self.keep_fits - 1],
            )
        return stored

    def prune_calibrations(self) -> int:
        key = ", ".join(CALIBRATION_KEY_COLUMNS)
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM calibrations WHERE rowid IN (SELECT stored FROM (SELECT rowid AS stored, "
                f"row_number() OVER (PARTITION BY {key} ORDER BY rowid DESC) AS newer FROM calibrations) WHERE newer > ?)",
                (self.keep_fits,),
            )
            return int(cursor.rowcount)

    def _probe_text(self, calibration_id: str) -> str | None:
        row = (
            self._connection()
            .execute("SELECT probe FROM calibrations WHERE id = ?", (calibration_id,))
            .fetchone()
        )
        return None if row is None else row["probe"]

    def refresh(self) -> int:
        # One at a time, so the last rowid seen only moves forward.
        with self._refresh_lock:
            rows = (
                self._connection()
                .execute(
                    "SELECT rowid AS stored, * FROM calibrations WHERE rowid > ? ORDER BY rowid",
                    (self._seen,),
                )
                .fetchall()
            )
            self._remember((row["stored"], _calibration(row)) for row in rows)
            if rows:
                self._seen = rows[-1]["stored"]
        return len(rows)

    # -- decisions and feedback ---------------------------------------------------------------

    def add_decisions(self, decisions: Iterable[DecisionRecord]) -> None:
        rows = [
            (d.id, d.model, d.revision, d.question_type, d.option_count, d.domain, json.dumps(d.options),
             json.dumps(d.uncalibrated_probabilities), int(d.informative), d.read_version, d.tenant, utc_now(),
             self._features_text(d))
            for d in decisions
        ]  # fmt: skip
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, "
                "uncalibrated_probabilities, informative, read_version, tenant, created_at, features) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            read_version=row["read_version"], tenant=row["tenant"], features=stored_features(row["features"]),
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

    def gold_rows(
        self, key: CalibrationKey, *, features: bool = False, limit: int = GOLD_LIMIT
    ) -> list[tuple]:
        state = ", d.features" if features else ""
        gold, params = gold_filter(key, "?")
        query = f"SELECT d.options, d.uncalibrated_probabilities, f.gold{state} {gold} ORDER BY f.seq DESC LIMIT ?"
        rows = self._connection().execute(query, [*params, limit]).fetchall()
        return [
            (json.loads(r["uncalibrated_probabilities"]), json.loads(r["options"]).index(r["gold"]))
            + ((stored_features(r["features"]),) if features else ())
            for r in reversed(rows)
        ]

    def feedback_count(self, key: CalibrationKey) -> int:
        gold, params = gold_filter(key, "?")
        return self._connection().execute(f"SELECT count(*) {gold}", params).fetchone()[0]

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
        self._closing.set()
        if self._poller is not threading.current_thread():
            self._poller.join(timeout=30)  # it closes its own connection on the way out
        db = getattr(self._local, "db", None)
        if db is not None:  # sqlite3 connections belong to their thread: this thread's one
            db.close()
            self._local.db = None


def _poll(store_ref: weakref.ref[SQLiteStore], closing: threading.Event, poll_s: float) -> None:
    """The background thread: ``refresh`` every ``poll_s`` until the store is closed or dropped."""
    while not closing.wait(poll_s):
        store = store_ref()
        if store is None:
            return
        try:
            store.refresh()
        except sqlite3.Error as error:  # a locked or busy file: the next poll tries again
            logger.warning("calibration refresh failed (%s); retrying in %.2f s", error, poll_s)
        del store  # not held across the wait: a dropped store is collected
    store = store_ref()
    db = None if store is None else getattr(store._local, "db", None)
    if db is not None:
        db.close()


def _calibration(row: sqlite3.Row) -> Calibration:
    fields = {k: row[k] for k in row.keys() if k != "stored"}
    fields["bias"] = None if fields["bias"] is None else tuple(json.loads(fields["bias"]))
    fields["probe"] = None if fields["probe"] is None else ProbeMap(fields["probe"])
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
