"""The calibration store's shared test material: a real PostgreSQL server, both backends as fixtures,
and the helpers the store contract and the tenant tests use.

A plain module, registered as a pytest plugin by the root conftest (``pytest_plugins``), so any test can
ask for ``postgres_server``, ``postgres_url``, ``location`` (a SQLite file, or a Postgres database in
the integration tier) or ``new_store`` by name, and imports the helpers from here, never from another
test module.

The server is Debian's ``postgresql`` package, run as the postgres user on 127.0.0.1 and a free port,
trust auth on loopback only, removed at the end of the session. Without the package the Postgres tests
skip locally and fail under CI (``.ci/run`` installs it).
"""

from __future__ import annotations

import glob
import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from calibration.open import open_store
from calibration.postgres_store import PostgresStore, migrate
from calibration.sqlite_store import MIGRATIONS as SQLITE_MIGRATIONS
from calibration.sqlite_store import SQLiteStore
from calibration.store import CalibrationKey, CalibrationStore, DecisionRecord
from deploy.processes import free_port
from tests.tools import missing_tool

VERSION = "decide-prompt/2"  # any version string: the store compares, never parses, it
KEY = CalibrationKey("smol", "rev1", "choice", 3, "support", read_version=VERSION)


def postgres_bin() -> Path | None:
    """The newest installed server's bin folder (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
    )
    return Path(found[-1]).parent if found else None


class PostgresServer:
    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir, self.root, self.data = bin_dir, root, root / "data"
        self.port = free_port()
        # initdb and postgres refuse to run as root; tests run as root in CI.
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")

    def run(self, *args: str) -> None:
        done = subprocess.run(
            [*self.as_owner, *args], check=False, capture_output=True, text=True, timeout=120
        )
        if done.returncode:
            log = self.root / "server.log"
            raise RuntimeError(
                f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}{log.read_text() if log.exists() else ''}"
            )

    def start(self) -> None:
        if self.as_owner:
            shutil.chown(self.root, "postgres", "postgres")
        self.run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories=''"  # TCP on loopback only
        self.run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:  # immediate: the data is thrown away, so no shutdown checkpoint
        stop = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        subprocess.run([*self.as_owner, *stop], check=False, capture_output=True, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database's URL: each test starts from nothing."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_server():
    bin_dir = postgres_bin() or missing_tool("postgresql")
    root = Path(
        tempfile.mkdtemp(prefix="opendecide-pg-")
    )  # not under pytest's root-only tmp: postgres must reach it
    server = PostgresServer(bin_dir, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server) -> str:
    return postgres_server.new_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "cal.sqlite3")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def new_store(location):
    """``new_store(**options)`` → a store on ``location``; every one opened is closed at the end."""
    opened = []

    def open_(**options) -> CalibrationStore:
        opened.append(open_store(location, **options))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


def query(location: str, sql: str) -> list[tuple]:
    """Read the backend directly, not through the store under test."""
    if location.startswith("postgresql://"):
        with psycopg.connect(location) as db:
            return db.execute(sql).fetchall()
    with sqlite3.connect(location) as db:
        return db.execute(sql).fetchall()


def eventually(check, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.005)
    return result


def decision(id_: str, key: CalibrationKey = KEY, *, informative: bool = True) -> DecisionRecord:
    """A recorded decision of ``key``; an uninformative one carries the floor's tie, as served."""
    return DecisionRecord(
        id_,
        key.model,
        key.revision,
        key.question_type,
        key.option_count,
        key.domain,
        ["a", "b", "c"],
        [0.5, 0.3, 0.2] if informative else [1 / 3] * 3,
        informative=informative,
        read_version=VERSION,
    )


def schema_at(location: str, version: int, *, recorded: bool = True) -> None:
    """An empty store at schema ``version``, built by the released migrations themselves (never
    edited, so they are what that opendecide ran); ``recorded=False``: a SQLite file from before
    ``schema_migrations`` existed."""
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True) as db:
            assert migrate(db, target=version) == version
        return
    with sqlite3.connect(location) as db:
        if recorded:
            db.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
        for number, description, statements in SQLITE_MIGRATIONS[:version]:
            for statement in statements:
                db.execute(statement)
            if recorded:
                db.execute("INSERT INTO schema_migrations VALUES (?, ?, 'then')", (number, description))


def counting_store(location: str, **options) -> CalibrationStore:
    """The backend's store, counting which threads take a database connection and the rows its
    refreshes read (the background thread's included)."""
    backend = PostgresStore if location.startswith("postgresql://") else SQLiteStore

    class Counting(backend):
        def __init__(self, *args, **kwargs) -> None:
            self.connections_by: list[int] = []  # before the backend's __init__, which already queries
            self.refreshes = self.rows_read = 0
            super().__init__(*args, **kwargs)

        def _connection(self):
            self.connections_by.append(threading.get_ident())
            return super()._connection()

        def refresh(self, *args) -> int:
            read = super().refresh(*args)
            self.refreshes += 1
            self.rows_read += read
            return read

    return Counting(location, **options)
