"""Open the calibration store a location names: the one place that knows both backends.

Callers (the service, ``decide serve --store``) pass what the user gave and need not know the
backends; ``calibration.store`` holds only the contract, so neither backend imports a module that
imports it back.
"""

from __future__ import annotations

from pathlib import Path

from calibration.sqlite_store import SQLiteStore
from calibration.store import CalibrationStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(location: Path | str, **options) -> CalibrationStore:
    """The store at ``location``: a ``postgresql://`` (or ``postgres://``) URL opens a
    ``PostgresStore`` (``options``: its pool size, poll interval, connect timeout), anything else is
    a file path for a ``SQLiteStore`` (``options``: its poll interval); both take ``keep_fits``."""
    if str(location).startswith(POSTGRES_SCHEMES):
        from opendecide.extras import needs_extra

        # Imported here so that SQLite users never load psycopg and its pool.
        with needs_extra("postgres", "a postgresql:// calibration store"):
            from calibration.postgres_store import PostgresStore

        return PostgresStore(str(location), **options)
    return SQLiteStore(location, **options)
