"""The load generator: N requests at a fixed concurrency, decisions/s and latency percentiles.

One generator for ``bench/`` and for ``decide eval load``: a caller passes an async ``send(i)`` that
makes request ``i`` and returns whether it succeeded. Latency uses the monotonic clock; failures
are counted beside successes, never dropped.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Send = Callable[[int], Awaitable[bool]]


def _cpuinfo_lines() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []


def cpu_flags() -> set[str]:
    """The first CPU's feature flags from /proc/cpuinfo (empty where the kernel has none to give)."""
    return set(
        next((line for line in _cpuinfo_lines() if line.startswith("flags")), ":").split(":", 1)[1].split()
    )


def machine_info() -> dict:
    """The machine a measurement ran on, for every benchmark and load report."""
    lines = _cpuinfo_lines()
    system = os.uname()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), system.machine
    )
    # platform.platform() and platform.processor() run `uname -p` in a child process; os.uname and the
    # C library's version give the same description without one.
    libc, version = platform.libc_ver()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": f"{system.sysname}-{system.release}-{system.machine}"
        + (f"-with-{libc}{version}" if libc else ""),
    }


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    requests: int
    completed: int
    failed: int
    wall_s: float
    decisions_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float

    def as_json(self) -> dict:
        return dict(self.__dict__)


def bench_args(arguments) -> dict:
    """A benchmark's resolved arguments as JSON values (paths as strings), for its manifest."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(arguments).items()}


def run_bench(parser, main, report) -> dict:
    """A benchmark's command line: print the resolved args, run, print the report, save JSON + markdown."""
    import argparse
    import json

    arguments: argparse.Namespace = parser.parse_args()
    print("args:", json.dumps(bench_args(arguments)))
    outcome = asyncio.run(main(arguments))
    print(report(outcome))
    if arguments.out:
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
        arguments.out.write_text(json.dumps(outcome, indent=2) + "\n")
        arguments.out.with_suffix(".md").write_text(report(outcome) + "\n")
    return outcome


async def run_load(send: Send, *, requests: int, concurrency: int) -> LoadResult:
    """Issue ``requests`` calls of ``send`` with at most ``concurrency`` in flight."""
    if requests < 1 or concurrency < 1:
        raise ValueError("requests and concurrency must be positive")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    latencies: list[float] = []
    failed = 0

    async def worker() -> None:
        nonlocal failed
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.monotonic()
            ok = False
            try:
                ok = await send(i)
            except Exception:  # a failed request is counted, not fatal to the run
                ok = False
            if ok:
                latencies.append((time.monotonic() - started) * 1000)
            else:
                failed += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.monotonic() - started
    completed = len(latencies)
    percentile = (lambda q: float(np.percentile(latencies, q))) if latencies else (lambda q: float("nan"))
    return LoadResult(
        concurrency=concurrency,
        requests=requests,
        completed=completed,
        failed=failed,
        wall_s=wall,
        decisions_per_s=completed / wall if wall > 0 else float("nan"),
        p50_ms=statistics.median(latencies) if latencies else float("nan"),
        p90_ms=percentile(90),
        p99_ms=percentile(99),
    )


async def vllm_prefix_counters(client) -> tuple[float, float]:
    """vLLM's prefix-cache hits and queries (in tokens) so far, summed over its engines, from the
    server's ``/metrics`` (``client``: an ``httpx.AsyncClient`` on the vLLM server)."""
    text = (await client.get("/metrics")).text
    totals = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]
