"""What every row of the probe shares: the keys, the questions, one row of the table, and the running server
(``Probe``: its client, process, key file, metrics port and log) with the requests every row makes."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

A = "probe-tenant-a-0123456789abcdef"
B = "probe-tenant-b-0123456789abcdef"
ADMIN = "probe-ops-admin-0123456789abcdef"
C = "probe-tenant-c-0123456789abcdef"  # added by the rotation row
KEY_FILE = f"""# issue 29's probe: two tenants and an operator
{A} tenant=a scopes=decide,calibrate
{B} tenant=b scopes=decide,calibrate
{ADMIN} tenant=ops scopes=decide,calibrate,admin
"""
ROTATED = f"""# rotated: b's key gone, c's new
{A} tenant=a scopes=decide,calibrate
{C} tenant=c scopes=decide,calibrate
{ADMIN} tenant=ops scopes=decide,calibrate,admin
"""
NOUL = {"type": "noul", "instructions": "Does the customer ask for money back?"}
OTHER_NOUL = {"type": "noul", "instructions": "Is the customer angry?"}  # an unrelated question, same type
DOMAIN = "refund-desk"
NOISE = 1e-4  # a probability difference no calibration makes: float noise of a cached read


@dataclass
class Row:
    probe: str
    then: str
    now: str
    passed: bool | None  # None: not re-run here (a test covers it)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its children (the server runs the model in process)."""
    total_kib = 0
    pids = [pid]
    with_children = Path(f"/proc/{pid}/task/{pid}/children")
    if with_children.exists():
        pids += [int(p) for p in with_children.read_text().split()]
    for each in pids:
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def examples(n: int, *, flip: bool) -> dict:
    """``n`` noul examples whose gold mostly opposes (``flip``) the model's lean, so a fit moves answers."""
    return {
        "domain": DOMAIN,
        "examples": [
            {
                "state": f"Ticket {i}: the parcel came late.",
                "questions": {"q": NOUL},
                "gold": {"q": (i % 3 != 0) != flip},
            }
            for i in range(n)
        ],
    }


def one_choice(options: list[str], state: str = "A fruit bowl with one red apple.") -> dict:
    criteria = dict.fromkeys(options)
    return {
        "state": state,
        "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": criteria}},
    }


def reason(response: httpx.Response) -> str:
    """A refusal's reason as the client sees it: the error type or the first validation message."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:60]
    if isinstance(detail, list) and detail:
        return f"{detail[0].get('msg', '')[:70]} at {'.'.join(map(str, detail[0].get('loc', [])))[:60]}"
    if isinstance(detail, dict):
        return f"{detail.get('error_type')}: {str(detail.get('message', ''))[:90]}"
    return str(detail)[:80]


class Probe:
    """The server under probe, the client that asks it, and the rows measured so far."""

    def __init__(
        self, client: httpx.AsyncClient, server: subprocess.Popen, keys: Path, metrics_url: str, log: Path
    ):
        self.client, self.server, self.keys, self.metrics_url = client, server, keys, metrics_url
        self.log = log  # the server's output: its access-log lines say how long it took itself
        self.rows: list[Row] = []

    def row(self, probe: str, then: str, now: str, passed: bool | None) -> None:
        self.rows.append(Row(probe, then, now, passed))

    async def ask(self, key: str, state: str, question: dict = NOUL, *, domain: str | None = DOMAIN) -> dict:
        body = {"state": state, "questions": {"q": question}} | ({"domain": domain} if domain else {})
        response = await self.client.post("/v1/systemone", json=body, headers=auth(key))
        response.raise_for_status()
        return response.json()["answers"]["q"]

    async def timed(self, method: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = await self.client.request(method, path, **kwargs)
        return response, time.monotonic() - started

    def server_latencies_s(self) -> dict[str, float]:
        """Request id → the server's own latency (its access-log lines: service/middleware/observe.py)."""
        latencies = {}
        for line in self.log.read_text(errors="replace").splitlines():
            start = line.find("{")
            try:
                entry = json.loads(line[start:]) if start >= 0 else None
            except ValueError:
                continue
            if isinstance(entry, dict) and "latency_ms" in entry and entry.get("request_id"):
                latencies[entry["request_id"]] = entry["latency_ms"] / 1000
        return latencies
