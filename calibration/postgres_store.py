"""The shared calibration store: PostgreSQL (psycopg 3), for replicas that serve from one database.

Writes are one transaction each; with Postgres's default ``synchronous_commit = on`` a write is
flushed to the server's WAL before the call returns, so an acknowledged write survives a crash of
the replica that made it and of the server. A pool bounds each replica's connections (Postgres
allows 100 by default, and the service calls the store from several worker threads at once).

Replicas pick up fits without a restart: a trigger NOTIFYs ``opendecide_calibrations`` on every
insert into ``calibrations``; each store LISTENs on its own connection in a background thread and
runs ``refresh`` when told, and every ``poll_s`` seconds besides, so a notification lost to a dropped
connection delays a pickup by at most that. ``refresh`` reads only the rows after the last ``seq``
seen (an index range scan: its cost is the new rows, not the table). A sequence number is drawn when
a row is inserted, not when it commits, so two concurrent inserts could commit out of order and a
reader could see the later number first and never look below it again; every insert of a fit
therefore holds a transaction-scoped advisory lock (``CALIBRATION_LOCK``), which Postgres releases
only after the commit is visible: the next insert draws its number after the previous one is
visible, so ``seq`` order is commit order. Lookups themselves never touch the database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

from opendecide.extras import needs_extra

with needs_extra("postgres", "a postgresql:// calibration store"):
    import psycopg
    from psycopg.rows import dict_row
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool

from calibration.probe import ProbeMap, stored_features
from calibration.probe_cache import ProbeCache
from calibration.store import (
    CALIBRATION_COLUMNS,
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
)

logger = logging.getLogger("opendecide.store")

CHANNEL = "opendecide_calibrations"
LISTENER_NAME = "opendecide-store-listener"  # its application_name, as pg_stat_activity shows it
# Any fixed number: the advisory lock that lets one replica at a time migrate the schema.
MIGRATION_LOCK = 0x0DEC1DE
# Another: held by every insert of a fit until it commits, so sequence order is commit order.
CALIBRATION_LOCK = 0x0DEC1DF

# Applied in order, each in the one transaction that records it in schema_migrations (DDL is
# transactional in Postgres). Never edit a released entry: add one.
MIGRATIONS: list[tuple[int, str, tuple[str, ...]]] = [
    (1, "calibrations, decisions, feedback", (
        """CREATE TABLE calibrations (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,
            model TEXT NOT NULL, revision TEXT NOT NULL, question_type TEXT NOT NULL, option_count INTEGER, domain TEXT,
            temperature DOUBLE PRECISION NOT NULL, n INTEGER NOT NULL,
            nll_before DOUBLE PRECISION, nll_after DOUBLE PRECISION, heldout_n INTEGER,
            heldout_ece_before DOUBLE PRECISION, heldout_ece_after DOUBLE PRECISION,
            source TEXT NOT NULL, fitted_at TIMESTAMPTZ NOT NULL)""",
        "CREATE INDEX calibrations_key ON calibrations (model, revision, question_type, option_count, domain, seq)",
        """CREATE TABLE decisions (
            id TEXT PRIMARY KEY, model TEXT NOT NULL, revision TEXT NOT NULL, question_type TEXT NOT NULL,
            option_count INTEGER NOT NULL, domain TEXT, options JSONB NOT NULL, raw_probabilities JSONB NOT NULL,
            informative BOOLEAN NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
        "CREATE INDEX decisions_key ON decisions (model, revision, question_type, option_count, domain)",
        """CREATE TABLE feedback (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, decision_id TEXT NOT NULL REFERENCES decisions (id),
            gold TEXT NOT NULL, received_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
        "CREATE INDEX feedback_decision ON feedback (decision_id, seq)",
    )),
    (2, "NOTIFY opendecide_calibrations on every new calibration", (
        f"""CREATE FUNCTION notify_calibration_added() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_notify('{CHANNEL}', NEW.id); RETURN NULL; END $$""",
        "CREATE TRIGGER calibration_added AFTER INSERT ON calibrations FOR EACH ROW EXECUTE FUNCTION notify_calibration_added()",
    )),
    # Rows already stored were read under the first prompt layout: tagged so, kept, and no longer
    # applied to reads of another version. The defaults are dropped after: every insert names it.
    (3, "prompt_version on calibrations and decisions; calibration mode and per-option bias", (
        f"ALTER TABLE calibrations ADD COLUMN prompt_version TEXT NOT NULL DEFAULT '{LEGACY_READ_VERSION}'",
        "ALTER TABLE calibrations ALTER COLUMN prompt_version DROP DEFAULT",
        "ALTER TABLE calibrations ADD COLUMN mode TEXT NOT NULL DEFAULT 'temperature'",
        "ALTER TABLE calibrations ADD COLUMN bias DOUBLE PRECISION[]",
        "ALTER TABLE calibrations ADD COLUMN heldout_ece_floor DOUBLE PRECISION",
        f"ALTER TABLE decisions ADD COLUMN prompt_version TEXT NOT NULL DEFAULT '{LEGACY_READ_VERSION}'",
        "ALTER TABLE decisions ALTER COLUMN prompt_version DROP DEFAULT",
        "CREATE INDEX calibrations_version_key ON calibrations (model, revision, prompt_version, question_type, option_count, domain, seq)",
    )),
    # The state_prior mode reads a key's latest decisions (``recorded``). Also a version step: a
    # replica that cannot read a state_prior calibration refuses this database (roll forward).
    (4, "decisions by key and time, for state_prior refits; calibration mode state_prior", (
        "CREATE INDEX decisions_recorded ON decisions (model, revision, prompt_version, question_type, option_count, created_at)",
    )),
    # Names that say what the columns hold: the version of the read (prompt version, +prior where the
    # prior correction was divided out) and the read before calibration. Renames keep every row and
    # the indexes on them; a replica from before refuses the renamed database (roll forward).
    (5, "read_version and uncalibrated_probabilities: prompt_version and raw_probabilities renamed; source 'labels' is 'examples'", (
        "ALTER TABLE calibrations RENAME COLUMN prompt_version TO read_version",
        "UPDATE calibrations SET source = 'examples' WHERE source = 'labels'",
        "ALTER TABLE decisions RENAME COLUMN prompt_version TO read_version",
        "ALTER TABLE decisions RENAME COLUMN raw_probabilities TO uncalibrated_probabilities",
    )),
    # Tenants: every row stored before belongs to the default tenant (what every key was). A calibration's
    # NULL tenant is a shared fit. The DEFAULTs stay so that replicas from before this migration, still
    # running during a roll forward, keep writing as the default tenant; one started after it refuses.
    (6, "tenant on calibrations, decisions and feedback; NULL tenant = shared calibration", (
        f"ALTER TABLE calibrations ADD COLUMN tenant TEXT DEFAULT '{DEFAULT_TENANT}'",
        f"ALTER TABLE decisions ADD COLUMN tenant TEXT NOT NULL DEFAULT '{DEFAULT_TENANT}'",
        f"ALTER TABLE feedback ADD COLUMN tenant TEXT NOT NULL DEFAULT '{DEFAULT_TENANT}'",
        "CREATE INDEX decisions_tenant_recorded ON decisions (tenant, model, revision, read_version, question_type, option_count, created_at)",
    )),
    # Retention keeps each key's latest fits and deletes the rest as a new one is stored: it finds a
    # key's fits newest first by this index, whatever the table's size.
    (7, "calibrations by whole key, newest first: retention of superseded fits", (
        "CREATE INDEX calibrations_latest ON calibrations (tenant, model, revision, read_version, question_type, option_count, domain, seq)",
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
    # The probe mode: its linear term and each decision's hidden state, as the SQLite store keeps them
    # (calibration/sqlite_store.py, migration 9: why, and why it is a version step).
    (9, "calibrations.probe and decisions.features: calibration mode probe", (
        "ALTER TABLE calibrations ADD COLUMN probe TEXT",
        "ALTER TABLE decisions ADD COLUMN features TEXT",
    )),
]  # fmt: skip
SCHEMA_VERSION = MIGRATIONS[-1][0]


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def migrate(db: psycopg.Connection, *, target: int = SCHEMA_VERSION) -> int:
    """Apply the migrations up to ``target`` that ``db`` lacks, in one transaction; the version after."""
    with db.transaction():
        # Taken before CREATE TABLE IF NOT EXISTS, which races with itself across sessions.
        db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        applied = {row[0] for row in db.execute("SELECT version FROM schema_migrations")}
        check_schema_version(max(applied, default=0), SCHEMA_VERSION, "this database")
        for version, description, statements in MIGRATIONS:
            if version not in applied and version <= target:
                for statement in statements:
                    db.execute(statement)
                db.execute(
                    "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                    (version, description),
                )
                applied.add(version)
    return max(applied, default=0)


class PostgresStore(CalibrationStore):
    """Thread-safe: a connection pool for calls, one more connection for the listener thread."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        poll_s: float = 1.0,
        connect_timeout_s: float = 10.0,
        keep_fits: int = KEEP_FITS,
        probe_cache: ProbeCache | None = None,
        record_features: bool = True,
    ) -> None:
        super().__init__(keep_fits=keep_fits, probe_cache=probe_cache, record_features=record_features)
        self.url = url
        self.poll_s = poll_s
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=int(connect_timeout_s)) as db:
                migrate(db)
        except psycopg.OperationalError as error:
            raise ConnectionError(
                f"cannot open the calibration store at {redacted(url)}: {error}".strip()
            ) from None
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "application_name": "opendecide-store"},
            check=ConnectionPool.check_connection,  # a connection the server dropped is replaced, not handed out
            name="opendecide-store",
            open=True,
        )
        self._seen = 0  # the last seq merged into the cache
        self._refresh_lock = threading.Lock()
        self.refresh()
        self._closing = threading.Event()
        self._listener = threading.Thread(target=self._listen, name="opendecide-store-listener", daemon=True)
        self._listener.start()

    def _connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """A pooled connection, for ``with``: every call's database access goes through here."""
        return self._pool.connection()

    def schema_version(self) -> int:
        with self._connection() as db:
            return db.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]

    def close(self) -> None:
        self._closing.set()
        self._listener.join(timeout=30)
        self._pool.close()

    # -- calibrations -------------------------------------------------------------------------

    def _insert_calibration(self, calibration: Calibration) -> int:
        row = calibration.as_json()
        row["fitted_at"] = dt.datetime.fromisoformat(calibration.fitted_at)
        where, params = calibration_filter(calibration.key, "%s")
        with self._connection() as db, db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (CALIBRATION_LOCK,))
            stored = db.execute(
                f"INSERT INTO calibrations ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))}) RETURNING seq",
                list(row.values()),
            ).fetchone()[0]
            # Older than the key's keep_fits-th newest (NULL, deleting nothing, while it has fewer).
            db.execute(
                f"DELETE FROM calibrations WHERE {where} AND seq < "
                f"(SELECT seq FROM calibrations WHERE {where} ORDER BY seq DESC LIMIT 1 OFFSET %s)",
                [*params, *params, self.keep_fits - 1],
            )
        return stored

    def prune_calibrations(self) -> int:
        key = ", ".join(CALIBRATION_KEY_COLUMNS)
        with self._connection() as db:
            cursor = db.execute(
                "DELETE FROM calibrations WHERE seq IN (SELECT seq FROM (SELECT seq, "
                f"row_number() OVER (PARTITION BY {key} ORDER BY seq DESC) AS newer FROM calibrations) AS ranked WHERE newer > %s)",
                (self.keep_fits,),
            )
            return cursor.rowcount

    def refresh(self, db: psycopg.Connection | None = None) -> int:
        """``CalibrationStore.refresh``, on ``db`` (the listener's own connection) or a pooled one."""
        # One at a time, so the last seq seen only moves forward.
        with self._refresh_lock, self._connection() if db is None else contextlib.nullcontext(db) as conn:
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    f"SELECT seq, {', '.join(CALIBRATION_COLUMNS)} FROM calibrations WHERE seq > %s ORDER BY seq",
                    (self._seen,),
                )
                .fetchall()
            )
            if rows:
                self._seen = rows[-1]["seq"]
            self._remember((row.pop("seq"), _calibration(row)) for row in rows)
        return len(rows)

    def _listen(self) -> None:
        """The background thread: LISTEN, refresh on a notification or every ``poll_s``; reconnect on errors."""
        while not self._closing.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, application_name=LISTENER_NAME) as db:
                    db.execute(f"LISTEN {CHANNEL}")
                    self.refresh(db)  # whatever was stored while this connection was down
                    polled = time.monotonic()
                    while not self._closing.is_set():
                        # Short waits so close() is prompt whatever poll_s is.
                        told = any(True for _ in db.notifies(timeout=min(self.poll_s, 0.5), stop_after=1))
                        if told or time.monotonic() - polled >= self.poll_s:
                            self.refresh(db)
                            polled = time.monotonic()
            except psycopg.Error as error:
                logger.warning("calibration listener lost its connection (%s); reconnecting", error)
                self._closing.wait(self.poll_s)

    # -- decisions and feedback ---------------------------------------------------------------

    def add_decisions(self, decisions: Iterable[DecisionRecord]) -> None:
        rows = [
            (d.id, d.model, d.revision, d.question_type, d.option_count, d.domain, Jsonb(list(d.options)),
             Jsonb(list(d.uncalibrated_probabilities)), bool(d.informative), d.read_version, d.tenant,
             self._features_text(d))
            for d in decisions
        ]  # fmt: skip
        if not rows:
            return
        with self._connection() as db, db.transaction(), db.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, "
                "uncalibrated_probabilities, informative, read_version, tenant, features) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )

    def _probe_text(self, calibration_id: str) -> str | None:
        with self._connection() as db:
            row = db.execute("SELECT probe FROM calibrations WHERE id = %s", (calibration_id,)).fetchone()
        return None if row is None else row[0]

    def decision(self, decision_id: str, tenant: str = DEFAULT_TENANT) -> DecisionRecord | None:
        with self._connection() as db:
            row = db.execute(
                "SELECT id, model, revision, question_type, option_count, domain, options, uncalibrated_probabilities, informative, read_version, features "
                "FROM decisions WHERE id = %s AND tenant = %s",
                (decision_id, tenant),
            ).fetchone()
        if row is None:
            return None
        return DecisionRecord(
            *row[:-2], read_version=row[-2], tenant=tenant, features=stored_features(row[-1])
        )

    def add_feedback(self, decision_id: str, gold: str, tenant: str = DEFAULT_TENANT) -> int:
        with self._connection() as db:
            return db.execute(
                "INSERT INTO feedback (decision_id, gold, tenant) VALUES (%s, %s, %s) RETURNING seq",
                (decision_id, gold, tenant),
            ).fetchone()[0]

    def prune_decisions(self, older_than: dt.datetime) -> int:
        with self._connection() as db:
            cursor = db.execute(
                "DELETE FROM decisions d WHERE d.created_at < %s AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.decision_id = d.id)",
                (older_than,),
            )
            return cursor.rowcount

    def gold_rows(
        self, key: CalibrationKey, *, features: bool = False, limit: int = GOLD_LIMIT
    ) -> list[tuple]:
        state = ", d.features" if features else ""
        gold, params = gold_filter(key, "%s")
        query = f"SELECT d.options, d.uncalibrated_probabilities, f.gold{state} {gold} ORDER BY f.seq DESC LIMIT %s"
        with self._connection() as db:
            rows = db.execute(query, [*params, limit]).fetchall()
        rows.reverse()
        if features:
            return [
                (uncalibrated, options.index(gold), stored_features(state))
                for options, uncalibrated, gold, state in rows
            ]
        return [(uncalibrated, options.index(gold)) for options, uncalibrated, gold in rows]

    def feedback_count(self, key: CalibrationKey) -> int:
        gold, params = gold_filter(key, "%s")
        with self._connection() as db:
            return db.execute(f"SELECT count(*) {gold}", params).fetchone()[0]

    def recorded(
        self, key: CalibrationKey, limit: int = RECORDED_LIMIT
    ) -> list[tuple[list[str], list[float]]]:
        where, params = key_filter(key, "%s")
        query = f"SELECT d.options, d.uncalibrated_probabilities FROM decisions d WHERE {where} AND d.informative ORDER BY d.created_at DESC, d.id DESC LIMIT %s"
        with self._connection() as db:
            rows = db.execute(query, [*params, limit]).fetchall()
        return [(options, uncalibrated) for options, uncalibrated in reversed(rows)]


def _calibration(row: dict) -> Calibration:
    fitted_at = row["fitted_at"].astimezone(dt.UTC).isoformat(timespec="microseconds")
    bias = None if row["bias"] is None else tuple(row["bias"])
    probe = None if row["probe"] is None else ProbeMap(row["probe"])
    return Calibration(**{**row, "fitted_at": fitted_at, "bias": bias, "probe": probe})
