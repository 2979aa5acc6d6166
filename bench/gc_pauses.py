"""What a full garbage-collector pass costs the serving process, before and after its start-up heap is
frozen (``service/heap.py``), measured side by side in one run.

The process holds what ``decide serve`` holds once its engine is open: the embedded model on the local
engine, and the app around it (``service.app.create_app``). Each pass is ``gc.collect(2)`` with nothing
else running, ``--repeats`` times before ``freeze_startup_heap`` and as many after; printed: the
objects a full pass walks, and each pass's median and range in ms.

    .venv/bin/python -m bench.gc_pauses > evidence/gc-pauses/output.md
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from service.app import create_app
from service.heap import freeze_startup_heap


def passes(repeats: int) -> list[float]:
    """ms of each of ``repeats`` full collections."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect(2)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    engine = LocalEngine(prepare_embedded_model())
    app = create_app(engine)
    gc.collect()
    rows = [("before", len(gc.get_objects(generation=2)), passes(args.repeats))]
    freeze_startup_heap()
    rows.append(("after freeze_startup_heap", len(gc.get_objects(generation=2)), passes(args.repeats)))
    print(
        f"`python -m bench.gc_pauses --repeats {args.repeats}`: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n"
    )
    print("| start-up heap | objects a full pass walks | full pass ms, median (min–max) |")
    print("|---|---|---|")
    for name, walked, times in rows:
        print(f"| {name} | {walked:,} | {statistics.median(times):.2f} ({min(times):.2f}–{max(times):.2f}) |")
    del app


if __name__ == "__main__":
    main()
