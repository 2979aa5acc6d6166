"""Issue 29's probe, re-run: one real ``decide serve`` on loopback, two tenants' keys and an admin key.

Not a test: a tool that re-asks, as a new user would, every question of the probe in issue 29 (run on
main c4a918e) that the embedded engine can answer, and prints a Markdown table: the probe's row, what
the issue found then, what this run measured now, and PASS/FAIL against what issue 29 asked for.

The service is ``python -m opendecide serve`` in its own process (the embedded model, the local engine)
with its own SQLite store file and key file in a temporary folder, ``--metrics-port`` on a second
loopback port. The key file (service/keys.py's format) holds tenant ``a``'s key, tenant ``b``'s key and
an ``admin`` key of tenant ``ops``; the rotation row rewrites it while the server runs. Resident memory
is the server process's ``VmRSS`` (``/proc``). Rows that need a vLLM engine (readiness after the engine
stops, orphans after the server is killed) and the abandoned-request row are printed with the test that
covers them, not re-run here. Exit status 1 when any row fails.

This module starts the server and runs the rows in order; the rows themselves are in ``tenants.py``
(keys and tenants) and ``bounds.py`` (bounds, memory, overload), what they share in ``session.py``.

Run (a quiet machine; about 5 minutes on two cores):

    python -m deploy.acceptance.probe > evidence/probe/output.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from deploy.acceptance.probe import bounds, tenants
from deploy.acceptance.probe.session import KEY_FILE, Probe, Row, rss_mib
from deploy.processes import free_port, wait_for_models

ROOT = Path(__file__).resolve().parents[3]  # the checkout: its git commit heads the report


def covered_by_tests(probe: Probe) -> None:
    """Rows the embedded engine cannot re-run, each printed with the test that covers it."""
    for label, then, test in (
        (
            "an abandoned large request",
            "kept a core busy to its end (~65 s)",
            "tests/service/test_bounds.py::test_an_abandoned_embedded_read_stops_between_chunks",
        ),
        (
            "a server-side deadline",
            "none: work stopped only when the client left",
            "tests/service/test_bounds.py::test_a_request_past_the_deadline_gets_504_and_its_read_is_stopped "
            "(default 60 s; the overload rows require every answer within 65 s)",
        ),
        (
            "/readyz after the vLLM engine is stopped",
            "ready while every decision got 503",
            "tests/service/test_bounds_ready.py::test_readyz_follows_the_engine_going_and_coming_back, "
            "tests/integration/test_engine_kill_restart.py::test_engine_absent_killed_and_back",
        ),
        (
            "killing the vLLM server",
            "~3.1 GiB of orphaned engine processes until the next `decide engine` call",
            "tests/deploy/test_engine_processes.py::test_a_killed_server_takes_its_engine_processes_with_it",
        ),
    ):
        probe.row(label, then, f"not re-run here: see {test}", None)


def table(rows: list[Row]) -> str:
    lines = ["| probe | then (issue 29, main c4a918e) | now (this run) | |", "|---|---|---|---|"]
    for row in rows:
        verdict = "PASS" if row.passed else "see test" if row.passed is None else "FAIL"
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in (row.probe, row.then, row.now)]
        lines.append(f"| {' | '.join(cells)} | {verdict} |")
    return "\n".join(lines)


def git_commit() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return commit + (" (dirty)" if dirty else "")


async def run(args: argparse.Namespace, folder: Path) -> list[Row]:
    keys = folder / "keys.txt"
    keys.write_text(KEY_FILE)
    port, metrics_port = free_port(), free_port()
    log = folder / "serve.log"
    command = [
        sys.executable, "-m", "opendecide", "serve", "--port", str(port), "--metrics-port", str(metrics_port),
        "--store", str(folder / "store.sqlite3"), "--api-key-file", str(keys),
    ]  # fmt: skip
    with log.open("w") as log_file:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        await asyncio.to_thread(wait_for_models, url, process=server, log=log, path="/readyz", timeout_s=180)
        print(f"server pid {server.pid} ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        baseline = rss_mib(server.pid)
        limits = httpx.Limits(
            max_connections=args.concurrency + 16, max_keepalive_connections=args.concurrency + 16
        )
        async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
            probe = Probe(client, server, keys, f"http://127.0.0.1:{metrics_port}", log)
            for step, *step_args in (
                (tenants.wrong_keys,),
                (tenants.isolation,),
                (bounds.names,),
                (bounds.strictness,),
                (bounds.calibration_admission, args.example_state_tokens),
                (tenants.metrics,),
                (tenants.rotation,),
                (bounds.memory, args.long_state_sentences, baseline),
                (bounds.overload, args.concurrency),
                (bounds.overload, args.concurrency, args.flood_padding_tokens),
            ):
                print(f"{datetime.now(UTC):%H:%M:%S} {step.__name__}", file=sys.stderr)
                await step(probe, *step_args)
            probe.row(
                "resident memory over the whole probe",
                "baseline grew 1.0 → ~3.0 GiB and was not released",
                f"{baseline:.0f} MiB at start → {rss_mib(server.pid):.0f} MiB at the end",
                rss_mib(server.pid) < baseline + 1024,
            )
            covered_by_tests(probe)
        server_errors = [line for line in log.read_text(errors="replace").splitlines() if "Traceback" in line]
        probe.row(
            "server log", "–", f"{len(server_errors)} tracebacks in the server's log", not server_errors
        )
        return probe.rows
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.acceptance.probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--concurrency", type=int, default=200, help="concurrent requests in the overload row"
    )
    parser.add_argument(
        "--example-state-tokens", type=int, default=6_050,
        help="' word' tokens per example state (12 examples: about 73,000 prompt tokens, the issue's set)",
    )  # fmt: skip
    parser.add_argument(
        "--long-state-sentences", type=int, default=504,
        help="10-token sentences in the long state of the memory row (504: about 5,040 tokens)",
    )  # fmt: skip
    parser.add_argument(
        "--flood-padding-tokens", type=int, default=400,
        help="a second flood with each state this many tokens longer: more work than the queue holds",
    )  # fmt: skip
    args = parser.parse_args()
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="opendecide-probe-") as folder:
        rows = asyncio.run(run(args, Path(folder)))
    print(f"# Issue 29's probe, re-run ({started:%Y-%m-%d %H:%M} UTC, commit {git_commit()})\n")
    print(f"`python -m deploy.acceptance.probe {' '.join(sys.argv[1:])}`: {vars(args)}; embedded engine (SmolLM2-135M-Instruct, "
          f"local), {os.cpu_count()} cores; server defaults (deadline, admission) unchanged.\n")  # fmt: skip
    print(table(rows))
    failed = [r.probe for r in rows if r.passed is False]
    print(f"\n{sum(r.passed is True for r in rows)} PASS, {len(failed)} FAIL, "
          f"{sum(r.passed is None for r in rows)} covered by tests; {(datetime.now(UTC) - started).total_seconds():.0f} s")  # fmt: skip
    return 1 if failed else 0
