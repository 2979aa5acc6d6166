"""Retention: superseded calibrations beyond each key's latest ``keep_fits`` are deleted, and decision
records older than the retention period, never given a gold answer, are deleted.

A decision record holds ids, the model, the question type, the option names and the raw
probabilities; never the state, instructions or descriptions. Records that got feedback stay: they
are the calibration's gold answers. The store already prunes a key's fits each time it stores one;
the periodic pass catches up keys stored before it did (``CalibrationStore.prune_calibrations``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from calibration.store import CalibrationStore

logger = logging.getLogger("opendecide.service")

PRUNE_EVERY_S = 3600.0


async def prune_periodically(
    store: CalibrationStore, retention: dt.timedelta | None, *, every_s: float = PRUNE_EVERY_S
) -> None:
    """Prune at once, then every ``every_s``, until cancelled: superseded fits always, decision records
    only with a ``retention`` (None keeps them). Each prune runs in a worker thread, off the event loop."""
    if retention is not None and retention <= dt.timedelta(0):
        raise ValueError("retention must be positive")
    while True:
        fits = await asyncio.to_thread(store.prune_calibrations)
        if fits:
            logger.info(
                "retention: deleted %d superseded calibrations (each key keeps its latest %d)",
                fits,
                store.keep_fits,
            )
        if retention is not None:
            cutoff = dt.datetime.now(dt.UTC) - retention
            pruned = await asyncio.to_thread(store.prune_decisions, cutoff)
            if pruned:
                logger.info(
                    "retention: deleted %d decision records without gold answers older than %s",
                    pruned,
                    cutoff.isoformat(timespec="seconds"),
                )
        await asyncio.sleep(every_s)
