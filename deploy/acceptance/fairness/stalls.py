"""The scenarios that stall the server for everyone: a 14 MB body, 50,000 calibration rows written by
another process, 1,100 half-open connections, an engine that stops answering."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import httpx

from deploy.acceptance.fairness.session import (
    Fairness,
    Sizes,
    counts,
    pct,
    say,
    small,
    spread,
    summary,
    warm_up,
)
from deploy.acceptance.probe.session import A, B, Row, auth, examples, ms, reason


async def huge_body(probe: Fairness, sizes: Sizes, path: str, then: str) -> None:
    """A ``body_mb`` JSON body of many small strings (each parsed into an object) while ``/healthz``
    is polled every 50 ms by a client of its own, in a thread of its own: polled on the event loop
    that also sends the 14 MB, the poll's times counted this process's own sending (a 6.7 s answer
    and a 1.9 s /healthz, where curl from another process saw 1.4 s and 127 ms)."""
    count = int(sizes.body_mb * 1e6 / 8)  # '"note", ' is 8 bytes
    body = json.dumps({"decision_id": "probe-none", "gold": "yes", "notes": ["note"] * count}).encode()
    healthz: list[tuple[int | str, float]] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=probe.client.base_url, timeout=70) as client:
            while not done.is_set():
                started = time.monotonic()
                try:
                    status = client.get("/healthz").status_code
                except httpx.TransportError as error:
                    status = type(error).__name__
                healthz.append((status, time.monotonic() - started))
                done.wait(0.05)

    polling = threading.Thread(target=poll, name="healthz-poll")
    polling.start()
    try:
        await asyncio.sleep(0.3)
        response, took = await probe.timed(
            "POST", path, content=body, headers=auth(A) | {"content-type": "application/json"}
        )
        await asyncio.sleep(0.3)
    finally:
        done.set()
        await asyncio.to_thread(polling.join)
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


async def calibration_rows(probe: Fairness, sizes: Sizes) -> None:
    await warm_up(probe, sizes)
    fitted = await probe.client.post("/v1/calibrations", json=examples(12, flip=True), headers=auth(A))
    fitted.raise_for_status()

    async def decisions(first: int) -> list:
        async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as b_client:
            for i in range(2):  # each server thread's first look after a write reloads: not the steady state
                await small(b_client, B, first + i)
            return [await small(b_client, B, first + 2 + i) for i in range(sizes.decisions)]

    await asyncio.to_thread(add_fits, probe.store, 24)
    few = await decisions(400)
    started = time.monotonic()
    await asyncio.to_thread(add_fits, probe.store, sizes.calibration_rows - 25)
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
    # A new connection per poll: a kept-alive one would not need the server to accept anything. The
    # polls come from another loopback address, as an orchestrator's probe comes from its node and not
    # from the client holding the connections (the service bounds connections per client address).
    limits = httpx.Limits(max_keepalive_connections=0)
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2", limits=limits)
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=3, transport=transport) as client:
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
        f"fds {server_fds}, {closed_by_server} closed by the server by the last poll; /healthz from 127.0.0.2 "
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


def engine_hang() -> tuple[Row, str]:
    """Needs a vLLM that hangs: the loopback stand-in (tests/integration/standin_vllm.py) imports tests,
    which deploy/ may not, so the row names the test that covers it."""
    test = "tests/service/test_bounds_ready.py::test_readyz_turns_503_soon_after_a_real_vllm_client_stops_getting_answers"
    return Row(
        "/readyz after the engine stops answering under load",
        "stayed 200 while the engine hung",
        f"not re-run here (needs a vLLM that hangs): see {test}",
        None,
    ), "503 within 10 s"
