"""Service test fixtures: a quick function engine; the run summary printed at the end.

Shared helpers (function engines, metric samples) are plain functions in ``support.py``.

A real server for an app in a thread is ``deploy.processes.serving``."""

from __future__ import annotations

import pytest

from readers.engines.base import ReadMode
from readers.engines.function import FunctionEngine
from tests.service.support import RUN_SUMMARIES, favour_first, function_engine


@pytest.fixture
def quick_engine(local_engine) -> FunctionEngine:
    """Answers every read at once (no model): for HTTP-semantics tests."""
    return function_engine(local_engine, favour_first, ReadMode.EXACT)


def pytest_terminal_summary(terminalreporter) -> None:
    for line in RUN_SUMMARIES:
        terminalreporter.write_line(line)
