"""A real PostgreSQL server for the store tests: Debian's ``postgresql`` package, run as the postgres
user on 127.0.0.1 and a free port, trust auth on loopback only, removed at the end of the session.

Without the package the Postgres tests skip locally and fail under CI (``.ci/run`` installs it).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from deploy.processes import free_port
from tests.tools import missing_tool


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
        import psycopg

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
