"""The calibration store: one SQLite file (WAL, synchronous=FULL) holding calibrations, decisions
and feedback. It persists and looks up; fitting lives in ``calibration.temperature``.

A calibration is keyed by (model, model revision, question type, option count, domain); option
count and domain may be NULL, meaning "any". Lookup takes the most specific that exists:
domain (type + count + domain) → type + count → type → none. Every write is one transaction that
is durable before the call returns (synchronous=FULL), so an acknowledged write survives a crash;
WAL lets readers run beside a writer, and ``busy_timeout`` makes concurrent writers wait, not fail.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS calibrations (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    question_type TEXT NOT NULL,
    option_count INTEGER,
    domain TEXT,
    temperature REAL NOT NULL,
    n INTEGER NOT NULL,
    nll_before REAL,
    nll_after REAL,
    heldout_n INTEGER,
    heldout_ece_before REAL,
    heldout_ece_after REAL,
    source TEXT NOT NULL,
    fitted_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS calibrations_key
    ON calibrations (model, revision, question_type, option_count, domain, fitted_at);
CREATE TABLE IF NOT EXISTS decisions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    question_type TEXT NOT NULL,
    option_count INTEGER NOT NULL,
    domain TEXT,
    options TEXT NOT NULL,
    raw_probabilities TEXT NOT NULL,
    informative INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    decision_id TEXT NOT NULL REFERENCES decisions (id),
    gold TEXT NOT NULL,
    received_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_decision ON feedback (decision_id);
"""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class CalibrationKey:
    model: str
    revision: str
    question_type: str
    option_count: int | None = None
    domain: str | None = None

    def fallbacks(self) -> list[CalibrationKey]:
        """This key and the less specific ones, most specific first."""
        keys = [self] if self.domain is not None else []
        keys.append(CalibrationKey(self.model, self.revision, self.question_type, self.option_count))
        keys.append(CalibrationKey(self.model, self.revision, self.question_type))
        return keys


@dataclass(frozen=True)
class Calibration:
    id: str
    model: str
    revision: str
    question_type: str
    option_count: int | None
    domain: str | None
    temperature: float
    n: int
    nll_before: float | None
    nll_after: float | None
    heldout_n: int | None
    heldout_ece_before: float | None
    heldout_ece_after: float | None
    source: str
    fitted_at: str

    @property
    def key(self) -> CalibrationKey:
        return CalibrationKey(self.model, self.revision, self.question_type, self.option_count, self.domain)

    def as_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DecisionRecord:
    id: str
    model: str
    revision: str
    question_type: str
    option_count: int
    domain: str | None
    options: list[str]
    raw_probabilities: list[float]
    informative: bool = True


class CalibrationStore:
    """Thread-safe: one connection per thread, all in WAL mode on the same file."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._raw().executescript(SCHEMA)
        self._migrate()
        self._latest: dict[CalibrationKey, Calibration] = {}
        self._cache_lock = threading.Lock()
        self._reload()

    def _migrate(self) -> None:
        """Bring a file written by an earlier version up to this schema (columns only ever added)."""
        columns = {row["name"] for row in self._raw().execute("PRAGMA table_info(decisions)")}
        if "informative" not in columns:
            with self._connect() as db:
                db.execute("ALTER TABLE decisions ADD COLUMN informative INTEGER NOT NULL DEFAULT 1")

    def _connect(self) -> _Transaction:
        return _Transaction(self._raw())

    def _raw(self) -> sqlite3.Connection:
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

    # -- calibrations -------------------------------------------------------------------------

    def add_calibration(self, key: CalibrationKey, *, temperature: float, n: int, source: str, **metrics: float | int | None) -> Calibration:
        calibration = Calibration(
            id=f"cal_{uuid.uuid4().hex[:16]}",
            model=key.model,
            revision=key.revision,
            question_type=key.question_type,
            option_count=key.option_count,
            domain=key.domain,
            temperature=float(temperature),
            n=int(n),
            nll_before=metrics.get("nll_before"),
            nll_after=metrics.get("nll_after"),
            heldout_n=metrics.get("heldout_n"),
            heldout_ece_before=metrics.get("heldout_ece_before"),
            heldout_ece_after=metrics.get("heldout_ece_after"),
            source=source,
            fitted_at=_now(),
        )
        row = calibration.as_json()
        with self._connect() as db:
            db.execute(f"INSERT INTO calibrations ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
        with self._cache_lock:
            self._latest[key] = calibration
        return calibration

    def _reload(self) -> None:
        rows = self._raw().execute("SELECT * FROM calibrations ORDER BY fitted_at").fetchall()
        latest = {}
        for row in rows:
            calibration = Calibration(**dict(row))
            latest[calibration.key] = calibration
        with self._cache_lock:
            self._latest = latest

    def calibrations(self) -> list[Calibration]:
        """The latest calibration of every key."""
        with self._cache_lock:
            return sorted(self._latest.values(), key=lambda c: c.fitted_at)

    def lookup(self, key: CalibrationKey) -> Calibration | None:
        """The most specific calibration for ``key``: domain → type + count → type → None.

        Fits written by other processes (workers) show up here: SQLite's ``data_version`` changes
        when another connection commits, and the cache is reloaded then.
        """
        version = self._raw().execute("PRAGMA data_version").fetchone()[0]
        if version != getattr(self._local, "seen_version", version):
            self._reload()
        self._local.seen_version = version
        with self._cache_lock:
            for candidate in key.fallbacks():
                found = self._latest.get(candidate)
                if found is not None:
                    return found
        return None

    # -- decisions and feedback ---------------------------------------------------------------

    def add_decisions(self, decisions: Iterable[DecisionRecord]) -> None:
        rows = [
            (d.id, d.model, d.revision, d.question_type, d.option_count, d.domain, json.dumps(d.options),
             json.dumps(d.raw_probabilities), int(d.informative), _now())
            for d in decisions
        ]  # fmt: skip
        with self._connect() as db:
            db.executemany(
                "INSERT INTO decisions (id, model, revision, question_type, option_count, domain, options, raw_probabilities, "
                "informative, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def decision(self, decision_id: str) -> DecisionRecord | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM decisions WHERE id = ?", (decision_id,)).fetchone()
        if row is None:
            return None
        return DecisionRecord(
            row["id"], row["model"], row["revision"], row["question_type"], row["option_count"], row["domain"],
            json.loads(row["options"]), json.loads(row["raw_probabilities"]), bool(row["informative"]),
        )  # fmt: skip

    def prune_decisions(self, older_than: dt.datetime) -> int:
        """Delete decisions recorded before ``older_than`` that never got feedback; returns how many.

        Decisions with feedback are kept: they are the labelled data refits are fitted on."""
        cutoff = older_than.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")
        with self._connect() as db:
            cursor = db.execute(
                "DELETE FROM decisions WHERE created_at < ? AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.decision_id = decisions.id)",
                (cutoff,),
            )
            return int(cursor.rowcount)

    def add_feedback(self, decision_id: str, gold: str) -> int:
        """Record the true answer for a decision; returns the feedback's sequence number."""
        with self._connect() as db:
            cursor = db.execute("INSERT INTO feedback (decision_id, gold, received_at) VALUES (?, ?, ?)", (decision_id, gold, _now()))
            return int(cursor.lastrowid)

    def labelled(self, key: CalibrationKey) -> list[tuple[list[float], int]]:
        """(raw probabilities, gold index) for every decision of ``key`` with feedback (latest wins);
        abstentions (no label came back) carry nothing to fit and are left out."""
        clauses = ["d.model = ?", "d.revision = ?", "d.question_type = ?"]
        params: list = [key.model, key.revision, key.question_type]
        if key.option_count is not None:
            clauses.append("d.option_count = ?")
            params.append(key.option_count)
        if key.domain is not None:
            clauses.append("d.domain = ?")
            params.append(key.domain)
        query = f"""
            SELECT d.options, d.raw_probabilities, f.gold FROM feedback f JOIN decisions d ON d.id = f.decision_id
            WHERE {' AND '.join(clauses)} AND d.informative = 1 AND f.seq = (SELECT MAX(seq) FROM feedback WHERE decision_id = f.decision_id)
            ORDER BY f.seq
        """
        with self._connect() as db:
            rows = db.execute(query, params).fetchall()
        return [(json.loads(r["raw_probabilities"]), json.loads(r["options"]).index(r["gold"])) for r in rows]

    def feedback_count(self, key: CalibrationKey) -> int:
        return len(self.labelled(key))


class _Transaction:
    """``with`` → BEGIN IMMEDIATE … COMMIT (or ROLLBACK): each call is one durable transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, error, traceback) -> None:
        self.db.execute("ROLLBACK" if kind else "COMMIT")
