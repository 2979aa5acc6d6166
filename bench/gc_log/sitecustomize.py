"""Logs every full (generation 2) garbage-collector pass of each Python process that imports it: the
wall time it ran, its length and what it collected, one line each, to ``/tmp/gc-<pid>.log``. Python
imports ``sitecustomize`` at start-up from the path, so a probe and the server it starts are both
logged without a change to either:

    PYTHONPATH=bench/gc_log:$PWD .venv/bin/python -m deploy.acceptance.fairness --only polite_beside_flood

The passes whose times fall before the server's "ready" line are start-up; the rest ran under load
(docs/reliability.md, "No full garbage-collector pass walks the model").
"""

import gc
import os
import sys
import time

_log = open(f"/tmp/gc-{os.getpid()}.log", "a", buffering=1)
_log.write(" ".join(sys.argv) + "\n")
_started: list[float] = []


def _timed(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        _log.write(
            f"{time.time():.3f} gen2 {(time.perf_counter() - _started[0]) * 1000:.1f} ms collected={info['collected']}\n"
        )


gc.callbacks.append(_timed)
