"""Retention: decision records older than the retention period, never given a gold answer, are deleted.

A decision record holds ids, the model, the question type, the option names and the raw
probabilities; never the state, instructions or descriptions. Records that got feedback stay: they
are the calibration's gold answers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from calibration.store import CalibrationStore

logger = logging.getLogger("opendecide.service")

PRUNE_EVERY_S = 3600.0


async def prune_periodically(
    store: CalibrationStore, retention: dt.timedelta, *, every_s: float = PRUNE_EVERY_S
) -> None:
    """Prune at once, then every ``every_s``, until cancelled."""
    if retention <= dt.timedelta(0):
        raise ValueError("retention must be positive")
    while True:
        cutoff = dt.datetime.now(dt.UTC) - retention
        pruned = await asyncio.to_thread(store.prune_decisions, cutoff)
        if pruned:
            logger.info(
                "retention: deleted %d decision records without gold answers older than %s",
                pruned,
                cutoff.isoformat(timespec="seconds"),
            )
        await asyncio.sleep(every_s)
