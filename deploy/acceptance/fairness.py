"""Issue 39's probe: can one caller starve or stall the others? One real ``decide serve`` on loopback.

Not a test: a tool that re-runs, against ``python -m opendecide serve`` in its own process (the embedded
model, the local engine, its own SQLite store file and key file in a temporary folder; tenants ``a`` and
``b`` and an admin key, ``deploy/acceptance/probe/session.py:KEY_FILE``), each way issue 39 (main
a0bd275) found for one caller to starve or stall the others, and prints what each scenario measured
(p50/p99 and ranges, counts by status) and then one Markdown table: the row, the issue's figure, the
figure measured now, the target, PASS/FAIL. Exit status 1 when any row fails.

The scenarios, in this order:

1. an abandoned batch, then a 1,200-word request: first, on the fresh server, because what the
   issue found (a 413 priced at the rate measured on the abandoned batch, "fastest measured 4 prompt
   tokens/s") needs a server that has measured nothing else yet;
2. a polite tenant beside a flooding one: tenant ``b`` alone first (its own p99 in this run), then
   beside tenant ``a`` looping large batches from one client;
3. a 255-option choice question in flight while small requests arrive;
4. a 14 MB JSON body on ``/v1/feedback`` and on ``/v1/systemone`` while ``/healthz`` is polled;
5. 50,000 calibration rows written into the store file by another process (this one), other tenants'
   fits, and another tenant's decision latency at 25 rows and at 50,000;
6. 1,100 connections that send half a request and hold, while ``/healthz`` is polled on new ones;
7. ``/readyz`` after the engine stops answering: needs a vLLM that hangs, printed with its test.

Between scenarios the tool waits until the server has no request in flight (``/metrics``), so that
work abandoned by one scenario is not counted against the next.

Run (a quiet machine; about 6 minutes on two cores, ``--quick`` about 2):

    python -m deploy.acceptance.fairness [--quick] > evidence/fairness/output.md
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from deploy.acceptance.probe.run import git_commit
from deploy.acceptance.probe.session import (
    KEY_FILE,
    NOUL,
    A,
    B,
    Probe,
    auth,
    examples,
    ms,
    one_choice,
    reason,
)
from deploy.processes import free_port, wait_for_models

ROOT = Path(__file__).resolve().parents[2]
OPEN_FILES_SOFT = 1_024
"""The server starts with this open-file soft limit (its hard limit unchanged): the usual default of a
shell and of systemd services, the limit the issue's 1,100 connections exhausted. A server that raises
its own soft limit, or bounds its connections, passes the half-open row; this machine's own default
(often far higher) would hide what a usual host shows."""
SETTLE_S = 120.0  # longest wait for the server to finish (or drop) a scenario's work: two deadlines


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

    def __init__(self, *args, port: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.port = port
        self.targets: list[str] = []

    def check(self, label: str, then: str, now: str, target: str, passed: bool | None) -> None:
        self.row(label, then, now, passed)
        self.targets.append(target)

    async def in_flight(self) -> float:
        text = (await self.client.get(f"{self.metrics_url}/metrics")).text
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("decide_in_flight_requests")
        )

    async def settle(self) -> None:
        """Wait until no request is in flight: what a scenario left behind ends before the next one."""
        deadline = time.monotonic() + SETTLE_S
        while await self.in_flight() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)


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


# -- the scenarios ------------------------------------------------------------------------------


async def abandoned_batch(probe: Fairness, sizes: Sizes) -> None:
    states = [words(f"Batch {i}", sizes.abandoned_words) for i in range(sizes.abandoned_states)]
    body = {"states": states, "questions": {"q": NOUL}}
    try:
        response = await probe.client.post("/decide/batch", json=body, headers=auth(A), timeout=5)
        left = f"answered {response.status_code} within 5 s"
    except httpx.TimeoutException:
        left = "abandoned at 5 s"
    await probe.settle()
    small_status, small_took, _ = await small(probe.client, A, 0)
    response, took = await probe.timed(
        "POST",
        "/v1/systemone",
        json={"state": words("Long", 1_200), "questions": {"q": NOUL}},
        headers=auth(A),
    )
    now = (
        f"{sizes.abandoned_states} × {sizes.abandoned_words}-word batch {left}; small {small_status} in "
        f"{ms(small_took)}; 1,200 words {response.status_code} in {ms(took)}"
        + ("" if response.status_code == 200 else f": {reason(response)}")
    )
    say(f"- abandoned batch: {now}")
    probe.check(
        "after an abandoned batch, a 1,200-word request",
        "413 'fastest measured 4 prompt tokens/s', still 60 s later",
        now,
        "answered (200, not 413)",
        response.status_code == 200,
    )


async def flood(probe: Fairness, sizes: Sizes, stop: asyncio.Event) -> list[tuple[int | str, float, str]]:
    """Tenant a's loops of large batches from one client until ``stop``: each batch's status, time and
    refusal reason. A refused batch is sent again after its Retry-After (1 s after a 413), as a client
    that keeps its work coming would: a flood of refusals sent back to back would load the cores with
    its own parsing and measure that instead."""
    states = [words(f"Flood {i}", sizes.flood_words) for i in range(sizes.flood_states)]
    results: list[tuple[int | str, float, str]] = []
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as client:

        async def loop(n: int) -> None:
            while not stop.is_set():
                body = {"states": [f"{n}-{len(results)} {s}" for s in states], "questions": {"q": NOUL}}
                started = time.monotonic()
                try:
                    response = await client.post("/decide/batch", json=body, headers=auth(A))
                except httpx.TransportError as error:
                    results.append((type(error).__name__, time.monotonic() - started, ""))
                    continue
                refused = response.status_code in (413, 529)
                results.append(
                    (response.status_code, time.monotonic() - started, reason(response) if refused else "")
                )
                if refused:
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))

        loops = [asyncio.ensure_future(loop(n)) for n in range(sizes.flood_loops)]
        await stop.wait()
        for each in loops:  # the batches in flight are abandoned: their connections close
            each.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    return results


async def polite_beside_flood(probe: Fairness, sizes: Sizes) -> None:
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as b_client:
        for i in range(10):  # a new server's first reads take up to seconds each: not b's steady state
            await small(b_client, B, 90 + i)
        alone = await paced(b_client, B, sizes.polite_alone, sizes.polite_every_s, 100)
        say(f"- polite tenant b alone, one request every {sizes.polite_every_s:g} s: {summary(alone)}")
        stop = asyncio.Event()
        flooding = asyncio.ensure_future(flood(probe, sizes, stop))
        await asyncio.sleep(3)  # the flood's first batches are in flight and queued
        flooded = await paced(b_client, B, sizes.polite_flooded, sizes.polite_every_s, 200)
        stop.set()
        a_results = await flooding
    await probe.settle()
    say(f"- polite tenant b beside the flood: {summary(flooded)}")
    say(
        f"- flooding tenant a, {sizes.flood_loops} loops of {sizes.flood_states} × {sizes.flood_words}-word "
        f"/decide/batch: {summary(a_results)} (the last {sizes.flood_loops} abandoned when b was done)"
    )
    alone_p99 = pct([t for s, t, _ in alone if s == 200] or [float("inf")], 0.99)
    answered = [t for s, t, _ in flooded if s == 200]
    refused = sum(s == 529 for s, _, _ in flooded)
    flooded_p99 = pct(answered, 0.99) if answered else float("inf")
    # A flood refused whole (413) never competed with b: the row then says so and fails.
    admitted = sum(s in (200, 504) for s, _, _ in a_results)
    probe.check(
        "polite tenant beside a flooding one",
        "b got 43 of 43 × 529; a's batches 504 at 60 s",
        f"b: {counts([s for s, _, _ in flooded])}, p99 {ms(flooded_p99)} vs {ms(alone_p99)} alone; "
        f"a: {counts([s for s, _, _ in a_results])}"
        + ("" if admitted else " (the flood was never admitted)"),
        "a's batches admitted; 0 × 529 for b, every b answered, p99 ≤ 3 × alone",
        admitted > 0 and refused == 0 and len(answered) == len(flooded) and flooded_p99 <= 3 * alone_p99,
    )


async def wide_choice(probe: Fairness, sizes: Sizes) -> None:
    question = one_choice([f"label {i}" for i in range(255)])
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as b_client:
        big = asyncio.ensure_future(probe.timed("POST", "/v1/systemone", json=question, headers=auth(A)))
        await asyncio.sleep(0.2)  # the wide question is priced and admitted first
        smalls = await paced(b_client, B, sizes.choice_small, 0.05, 300)
        (response, took) = await big
    await probe.settle()
    prompt_tokens = (
        response.json()["answers"]["q"]["x_reading"].get("prompt_tokens")
        if response.status_code == 200
        else None
    )
    say(
        f"- 255-option question: {response.status_code} in {ms(took)}"
        + (f", {prompt_tokens} prompt tokens read" if prompt_tokens else f": {reason(response)}")
    )
    say(f"- {sizes.choice_small} small requests meanwhile: {summary(smalls)}")
    statuses = [s for s, _, _ in smalls]
    probe.check(
        "a 255-option question beside small requests",
        "priced 14,717 tokens, answered in 2.7 s; 25 of 25 small got 529 'expected wait 18 s'",
        f"the question {response.status_code} in {ms(took)}; small: {counts(statuses)}",
        "every small request answered, none 529",
        all(s == 200 for s in statuses),
    )


async def huge_body(probe: Fairness, sizes: Sizes, path: str, then: str) -> None:
    """A ``body_mb`` JSON body of many small strings (each parsed into an object) while ``/healthz``
    is polled every 50 ms on a client of its own."""
    count = int(sizes.body_mb * 1e6 / 8)  # '"note", ' is 8 bytes
    body = json.dumps({"decision_id": "probe-none", "gold": "yes", "notes": ["note"] * count}).encode()
    healthz: list[tuple[int | str, float]] = []
    done = asyncio.Event()

    async def poll(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                status = (await client.get("/healthz")).status_code
            except httpx.TransportError as error:
                status = type(error).__name__
            healthz.append((status, time.monotonic() - started))
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as client:
        polling = asyncio.ensure_future(poll(client))
        await asyncio.sleep(0.3)
        response, took = await probe.timed(
            "POST", path, content=body, headers=auth(A) | {"content-type": "application/json"}
        )
        await asyncio.sleep(0.3)
        done.set()
        await polling
    await probe.settle()
    latencies = [t for _, t in healthz]
    now = (
        f"{len(body) / 1e6:.1f} MB: {response.status_code} in {ms(took)} ({reason(response)}); /healthz "
        f"{counts([s for s, _ in healthz])}, {spread(latencies)}"
    )
    say(f"- {path} body: {now}")
    probe.check(
        f"a {sizes.body_mb:g} MB body on {path}",
        then,
        f"{response.status_code} in {ms(took)}; /healthz max {ms(max(latencies))}",
        "/healthz answers in < 100 ms meanwhile",
        all(s == 200 for s, _ in healthz) and max(latencies) < 0.1,
    )


def add_fits(store: Path, count: int) -> None:
    """``count`` copies of the store's first fit as other tenants' fits, written by this process in one
    transaction: the server sees another process's writes (``calibration/sqlite_store.py``)."""
    db = sqlite3.connect(store, timeout=30, isolation_level=None)
    try:
        db.row_factory = sqlite3.Row
        template = dict(db.execute("SELECT * FROM calibrations ORDER BY rowid LIMIT 1").fetchone())
        columns = list(template)
        first = db.execute("SELECT COUNT(*) FROM calibrations").fetchone()[0]
        rows = [
            [*(template | {"id": f"cal_{uuid.uuid4().hex[:16]}", "tenant": f"other-{first + i}"}).values()]
            for i in range(count)
        ]
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            f"INSERT INTO calibrations ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", rows
        )
        db.execute("COMMIT")
    finally:
        db.close()


async def calibration_rows(probe: Fairness, sizes: Sizes, store: Path) -> None:
    fitted = await probe.client.post("/v1/calibrations", json=examples(12, flip=True), headers=auth(A))
    fitted.raise_for_status()

    async def decisions(first: int) -> list:
        async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as b_client:
            for i in range(2):  # each server thread's first look after a write reloads: not the steady state
                await small(b_client, B, first + i)
            return [await small(b_client, B, first + 2 + i) for i in range(sizes.decisions)]

    await asyncio.to_thread(add_fits, store, 24)
    few = await decisions(400)
    started = time.monotonic()
    await asyncio.to_thread(add_fits, store, sizes.calibration_rows - 25)
    inserted = time.monotonic() - started
    many = await decisions(500)
    say(f"- tenant b's decisions at 25 calibration rows: {summary(few)}")
    say(f"- at {sizes.calibration_rows:,} rows (inserted in {ms(inserted)}): {summary(many)}")
    p50_few = pct([t for s, t, _ in few if s == 200] or [float("inf")], 0.5)
    answered = [t for s, t, _ in many if s == 200]
    p50_many = pct(answered, 0.5) if answered else float("inf")
    probe.check(
        f"another tenant's decision at {sizes.calibration_rows:,} calibration rows",
        "p50 62 → 1,324 ms at 25 → 50,000 rows",
        f"p50 {ms(p50_few)} → {ms(p50_many)} ({counts([s for s, _, _ in many])})",
        "p50 within 20% of its figure at 25 rows",
        len(answered) == len(many) and p50_many <= 1.2 * p50_few,
    )


def open_files_soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise RuntimeError(f"no open-file limit in /proc/{pid}/limits")


async def half_open(probe: Fairness, sizes: Sizes) -> None:
    limit = open_files_soft_limit(probe.server.pid)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = sizes.half_open + 256  # this process holds one end of each connection
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted) if hard > 0 else wanted, hard))
    partial = b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed: list[str] = []

    async def hold() -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", probe.port), 10)
            writer.write(partial)
            await writer.drain()
            held.append((reader, writer))
        except (OSError, TimeoutError) as error:
            failed.append(type(error).__name__)

    await asyncio.gather(*(hold() for _ in range(sizes.half_open)))
    server_fds = len(os.listdir(f"/proc/{probe.server.pid}/fd"))
    polls: list[tuple[int | str, float]] = []
    # A new connection per poll: a kept-alive one would not need the server to accept anything.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=3, limits=limits) as client:
        for _ in range(10):
            started = time.monotonic()
            try:
                status = (await client.get("/healthz")).status_code
            except httpx.TransportError as error:
                status = type(error).__name__
            polls.append((status, time.monotonic() - started))
            await asyncio.sleep(0.5)
    closed_by_server = sum(reader.at_eof() for reader, _ in held)
    for _, writer in held:
        writer.close()
    await asyncio.gather(*(writer.wait_closed() for _, writer in held), return_exceptions=True)
    now = (
        f"server soft limit {limit} open files; {len(held)} held ({counts(failed)} failed to open), server "
        f"fds {server_fds}, {closed_by_server} closed by the server by the last poll; /healthz "
        f"{counts([s for s, _ in polls])}, {spread([t for s, t in polls if s == 200])}"
    )
    say(f"- {sizes.half_open:,} half-open connections: {now}")
    probe.check(
        f"{sizes.half_open:,} half-sent-header connections without a key",
        "exhausted the open-file limit; /healthz got connection resets",
        now,
        "/healthz keeps answering (every poll 200)",
        all(s == 200 for s, _ in polls),
    )


def engine_hang(probe: Fairness) -> None:
    # The loopback stand-in vLLM (tests/integration/standin_vllm.py) imports tests, which deploy/ may not.
    test = "tests/service/test_bounds_ready.py"
    probe.check(
        "/readyz after the engine stops answering under load",
        "stayed 200 while the engine hung",
        f"not re-run here (needs a vLLM that hangs): see {test}",
        "503 within 10 s",
        None,
    )


# -- the run ------------------------------------------------------------------------------------


def usual_open_files() -> None:
    # Runs in the server's process before it starts Python: see OPEN_FILES_SOFT.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = OPEN_FILES_SOFT if hard == resource.RLIM_INFINITY else min(OPEN_FILES_SOFT, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.asynccontextmanager
async def served(folder: Path) -> AsyncIterator[Fairness]:
    """``decide serve`` with the probe's key file and its own store in ``folder``, until the block ends."""
    keys = folder / "keys.txt"
    keys.write_text(KEY_FILE)
    port, metrics_port = free_port(), free_port()
    log = folder / "serve.log"
    command = [
        sys.executable, "-m", "opendecide", "serve", "--port", str(port), "--metrics-port", str(metrics_port),
        "--store", str(folder / "store.sqlite3"), "--api-key-file", str(keys),
    ]  # fmt: skip
    with log.open("w") as log_file:
        server = subprocess.Popen(
            command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=usual_open_files
        )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        await asyncio.to_thread(wait_for_models, url, process=server, log=log, path="/readyz", timeout_s=180)
        print(f"server pid {server.pid} ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            yield Fairness(client, server, keys, f"http://127.0.0.1:{metrics_port}", log, port=port)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def steps(sizes: Sizes, store: Path) -> list[tuple]:
    """The scenarios in their order, each with its arguments."""
    return [
        (abandoned_batch, sizes),
        (polite_beside_flood, sizes),
        (wide_choice, sizes),
        (huge_body, sizes, "/v1/feedback", "stalled /healthz 8.3 s"),
        (huge_body, sizes, "/v1/systemone", "stalled /healthz 18.1 s"),
        (calibration_rows, sizes, store),
        (half_open, sizes),
    ]


SCENARIOS = [step.__name__ for step, *_ in steps(Sizes(), Path())]


async def run(sizes: Sizes, folder: Path, only: list[str] | None = None) -> Fairness:
    async with served(folder) as probe:
        for step, *step_args in steps(sizes, folder / "store.sqlite3"):
            if only and step.__name__ not in only:
                continue
            print(f"{datetime.now(UTC):%H:%M:%S} {step.__name__}", file=sys.stderr)
            await step(probe, *step_args)
        if not only:
            engine_hang(probe)
        return probe


def table(probe: Fairness) -> str:
    lines = ["| row | issue 39 (main a0bd275) | now (this run) | target | |", "|---|---|---|---|---|"]
    for row, target in zip(probe.rows, probe.targets, strict=True):
        verdict = "PASS" if row.passed else "see test" if row.passed is None else "FAIL"
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in (row.probe, row.then, row.now, target)]
        lines.append(f"| {' | '.join(cells)} | {verdict} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.acceptance.fairness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller floods and counts: a smoke run of every scenario"
    )
    parser.add_argument(
        "--only", action="append", choices=sorted(set(SCENARIOS)), help="run only this scenario (repeatable)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    started = datetime.now(UTC)
    say(f"# Issue 39's probe: fairness ({started:%Y-%m-%d %H:%M} UTC, commit {git_commit()})\n")
    say(f"`python -m deploy.acceptance.fairness {' '.join(argv if argv is not None else sys.argv[1:])}`: embedded engine "
        f"(local), {os.cpu_count()} cores, server defaults; sizes {asdict(sizes)}\n")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="opendecide-fairness-") as folder:
        probe = asyncio.run(run(sizes, Path(folder), args.only))
    say()
    say(table(probe))
    failed = [r.probe for r in probe.rows if r.passed is False]
    say(f"\n{sum(r.passed is True for r in probe.rows)} PASS, {len(failed)} FAIL, "
        f"{sum(r.passed is None for r in probe.rows)} covered by tests; {(datetime.now(UTC) - started).total_seconds():.0f} s")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
