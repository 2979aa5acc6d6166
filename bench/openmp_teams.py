"""What a second thread's OpenMP team costs the local engine: one chunk, timed on each kind of thread.

torch's OpenMP on Linux (libgomp) keeps a team of helper threads for every thread that ran a parallel
region on more than one thread, and once it manages more threads than there are cores, its helpers
spin only briefly before sleeping between regions. This bench computes the same chunk (``--tokens``
new tokens after a ``--past``-token cached state, the shape of 8 short questions about a state the
engine has seen) with ``LocalEngine.compute`` on the whole thread budget:

1. ``alone``: on a fresh thread, the only one that ever ran a multi-threaded region;
2. ``second team``: on another fresh thread, after the first one ran the same and is still alive
   (two teams: what two batch workers did until the engine kept one compute thread).

Each prints the median latency and the cores busy meanwhile (process CPU time ÷ wall time).

    .venv/bin/python -m bench.openmp_teams > evidence/one-compute-thread/openmp-teams.md
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import threading
import time

import torch

from readers.embedded import prepare_embedded_model
from readers.engines.base import LocalBatching
from readers.engines.local import LocalEngine


def timed(engine: LocalEngine, state: list[int], tokens: int, repeats: int) -> tuple[float, float]:
    """Median ms and median cores busy of ``repeats`` computes of ``tokens`` new tokens after ``state``."""
    torch.get_num_threads()  # torch's per-thread setup first, then this thread's count
    torch.set_num_threads(engine.thread_budget)
    generator = torch.Generator().manual_seed(len(state))
    latencies, busy = [], []
    for _ in range(repeats):
        prompt = state + torch.randint(100, 40_000, (tokens,), generator=generator).tolist()
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        engine.compute([prompt], keep=[False])
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        latencies.append(wall * 1000)
        busy.append(cpu / wall)
    return statistics.median(latencies), statistics.median(busy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=143)
    parser.add_argument("--past", type=int, default=213)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    # The engine's own compute thread stays idle: every compute here runs on the calling thread.
    engine = LocalEngine(prepare_embedded_model(), batching=LocalBatching(prefix_cache_mib=64))
    state = torch.randint(100, 40_000, (args.past,), generator=torch.Generator().manual_seed(0)).tolist()
    results: dict[str, tuple[float, float]] = {}
    first_done, release = threading.Event(), threading.Event()

    def first() -> None:
        engine.compute([state])  # the cached state, and this thread's team
        results["alone"] = timed(engine, state, args.tokens, args.repeats)
        first_done.set()
        release.wait()  # alive, team kept, while the second thread computes

    def second() -> None:
        results["second team"] = timed(engine, state, args.tokens, args.repeats)

    one = threading.Thread(target=first)
    one.start()
    first_done.wait()
    two = threading.Thread(target=second)
    two.start()
    two.join()
    release.set()
    one.join()
    print(
        f"{os.cpu_count()} cores, thread budget {engine.thread_budget}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; {args.tokens} new tokens after a {args.past}-token "
        f"cached state, {args.repeats} computes each, medians\n"
    )
    print("| thread | ms | cores busy |\n|---|---|---|")
    for name, (ms, busy) in results.items():
        print(f"| {name} | {ms:.0f} | {busy:.2f} |")
    alone, second_team = results["alone"][0], results["second team"][0]
    print(f"\nsecond team ÷ alone: {second_team / alone:.2f}")


if __name__ == "__main__":
    main()
