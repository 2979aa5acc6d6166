"""What every scenario of the fairness probe shares: the sizes it sends, the running server with its rows
and targets (``Fairness``), small requests, and the figures it prints (percentiles, ranges, counts)."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from deploy.acceptance.probe.session import NOUL, A, B, Probe, auth, ms, reason


@dataclass(frozen=True)
class Sizes:
    """What each scenario sends; ``--quick`` shrinks the floods and counts, never the issue's single
    requests (the 1,200-word request, the 255 options, the 14 MB body, the 1,100 connections)."""

    abandoned_states: int = 30
    abandoned_words: int = 1_000
    flood_states: int = 40
    flood_words: int = 900
    flood_loops: int = 2  # batches a's client keeps in flight at once: one queued behind the one read
    polite_every_s: float = 2.0
    polite_alone: int = 10
    polite_flooded: int = 25
    choice_small: int = 25
    body_mb: float = 14.0  # the size: under the 16 MiB body limit
    calibration_rows: int = 50_000
    decisions: int = 20
    half_open: int = 1_100


QUICK = Sizes(
    abandoned_states=10, abandoned_words=500, flood_states=12, flood_words=400, polite_every_s=1.0,
    polite_alone=5, polite_flooded=8, choice_small=10, calibration_rows=10_000, decisions=8,
)  # fmt: skip


class Fairness(Probe):
    """The probe's server and rows, each row with the target it is judged against."""

    def __init__(self, *args, port: int, store: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.port, self.store = port, store  # the server's port and its SQLite store file
        self.targets: list[str] = []

    def check(self, label: str, then: str, now: str, target: str, passed: bool | None) -> None:
        self.row(label, then, now, passed)
        self.targets.append(target)


def say(line: str = "") -> None:
    print(line, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: list[float]) -> str:
    """p50, p99 and the range of latencies in seconds, as a reader scans them."""
    if not values:
        return "no answers"
    return (
        f"p50 {ms(pct(values, 0.5))}, p99 {ms(pct(values, 0.99))}, range {ms(min(values))}–{ms(max(values))}"
    )


def counts(statuses: list[int | str]) -> str:
    return (
        ", ".join(
            f"{c} × {s}" for s, c in sorted(collections.Counter(statuses).items(), key=lambda kv: str(kv[0]))
        )
        or "none"
    )


def words(label: str, n: int) -> str:
    """A state of about ``n`` tokens (`` word`` is one token), distinct from its first token on."""
    return f"{label}:" + " word" * n


async def small(client: httpx.AsyncClient, key: str, i: int) -> tuple[int | str, float, str]:
    """One small one-question decision: its status (or the transport error), latency and refusal reason."""
    body = {"state": f"Ticket {i}: the parcel came late.", "questions": {"q": NOUL}}
    started = time.monotonic()
    try:
        response = await client.post("/v1/systemone", json=body, headers=auth(key))
    except httpx.TransportError as error:
        return type(error).__name__, time.monotonic() - started, ""
    took = time.monotonic() - started
    return response.status_code, took, "" if response.status_code == 200 else reason(response)


async def paced(client: httpx.AsyncClient, key: str, n: int, every_s: float, first: int) -> list:
    """``n`` small requests, one leaving every ``every_s`` whatever came back before (open loop)."""

    async def at(i: int):
        await asyncio.sleep(i * every_s)
        return await small(client, key, first + i)

    return await asyncio.gather(*(at(i) for i in range(n)))


def summary(results: list) -> str:
    answered = [t for s, t, _ in results if s == 200]
    reasons = collections.Counter(r for s, _, r in results if s != 200)
    why = f"; first refusal: {reasons.most_common(1)[0][0]}" if reasons else ""
    return f"{counts([s for s, _, _ in results])}; 200s {spread(answered)}{why}"


async def warm_up(probe: Fairness, sizes: Sizes) -> None:
    """What a server in service has done before the scenario: b's first small requests (a new server's
    first reads take up to seconds each) and one of a's batches at a tenth of the flood's size, so the
    service has measured its rate on real work, not only on small requests."""
    for i in range(10):
        await small(probe.client, B, 900_000 + i)
    states = [words(f"Warm {i}", sizes.flood_words) for i in range(max(1, sizes.flood_states // 10))]
    response = await probe.client.post(
        "/decide/batch", json={"states": states, "questions": {"q": NOUL}}, headers=auth(A)
    )
    say(
        f"- warm-up: 10 small requests, then a {len(states)} × {sizes.flood_words}-word batch: {response.status_code}"
    )
