"""The container images a service runs from, reported in every answer's provenance.

Apart from ``decide.py`` so the command line builds its defaults without loading the numerical stack.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServedImages:
    """Container images by digest (``repo@sha256:…``), passed in at start-up; None when not in one."""

    engine: str | None = None
    service: str | None = None
