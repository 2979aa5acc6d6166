"""Issue 29's probe, re-run: one real ``decide serve`` on loopback, two tenants' keys and an admin key.

Not a test: a script that re-asks, as a new user would, every question of the probe in issue 29 (run on
main c4a918e) that the embedded engine can answer, and prints a Markdown table: the probe's row, what
the issue found then, what this run measured now, and PASS/FAIL against what issue 29 asked for.

The service is ``python -m opendecide serve`` in its own process (the embedded model, the local engine)
with its own SQLite store file and key file in a temporary folder, ``--metrics-port`` on a second
loopback port. The key file (service/auth.py's format) holds tenant ``a``'s key, tenant ``b``'s key and
an ``admin`` key of tenant ``ops``; the rotation row rewrites it while the server runs. Resident memory
is the server process's ``VmRSS`` (``/proc``). Rows that need a vLLM engine (readiness after the engine
stops, orphans after the server is killed) and the abandoned-request row are printed with the test that
covers them, not re-run here. Exit status 1 when any row fails.

Run (a quiet machine; about 5 minutes on two cores):

    .venv/bin/python bench/probe.py > evidence/probe/output.md
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.processes import free_port, wait_for_models
from service.keys import digest, key_id

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

    async def wrong_keys(self) -> None:
        statuses = collections.Counter()
        for headers in ({}, auth("not-a-key-0123456789abcdef"), {"authorization": A}, auth(A[:-1])):
            response = await self.client.post("/v1/systemone", json=one_choice(["x", "y"]), headers=headers)
            statuses[response.status_code] += 1
        self.row(
            "wrong or missing key (4 kinds)",
            "401 for every wrong key (held)",
            ", ".join(f"{n} × {s}" for s, n in sorted(statuses.items())),
            set(statuses) == {401},
        )

    async def isolation(self) -> None:
        b_before = await self.ask(B, "Ticket 99: where is my parcel?")
        b_other_before = await self.ask(B, "Ticket 98: nobody answers my mails.", OTHER_NOUL, domain=None)
        fitted = await self.client.post("/v1/calibrations", json=examples(12, flip=True), headers=auth(A))
        fitted.raise_for_status()
        (a_fit,) = fitted.json()["calibrations"]
        a_answer = await self.ask(A, "Ticket 99: where is my parcel?")
        b_after = await self.ask(B, "Ticket 99: where is my parcel?")
        b_other_after = await self.ask(B, "Ticket 98: nobody answers my mails.", OTHER_NOUL, domain=None)
        a_used = (a_answer["x_reading"]["calibration"] or {}).get("id")
        # Unchanged up to float noise: a state read again reuses its cached keys and values (the local
        # engine's prefix cache), which sums in another order; the issue's leak moved B's answer by 0.034.
        unchanged = (
            b_after["x_reading"]["calibration"] is None
            and b_other_after["x_reading"]["calibration"] is None
            and abs(b_after["noul"] - b_before["noul"]) < NOISE
            and abs(b_other_after["noul"] - b_other_before["noul"]) < NOISE
        )
        self.row(
            "A's fit applied to B's answers?",
            "yes: B's answer moved 0.464/0.536 → 0.498/0.502 (also an unrelated question of the type)",
            f"A's fit {a_fit['id']} on A's answer: {a_used == a_fit['id']}; B's P(yes) "
            f"{b_before['noul']:.4f} → {b_after['noul']:.4f}, unrelated {b_other_before['noul']:.4f} → "
            f"{b_other_after['noul']:.4f}; calibrations on B's answers: "
            f"{[(x['x_reading']['calibration'] or {}).get('id') for x in (b_after, b_other_after)]}, P(yes) changes "
            f"{b_after['noul'] - b_before['noul']:.2g}, {b_other_after['noul'] - b_other_before['noul']:.2g} "
            f"(tolerance {NOISE:g}; tokens reused on the second read: {b_after['x_reading']['tokens_reused']})",
            unchanged and a_used == a_fit["id"],
        )

        listed = {
            who: [
                c["id"]
                for c in (await self.client.get("/v1/calibrations", headers=auth(k))).json()["calibrations"]
            ]
            for who, k in (("A", A), ("B", B))
        }
        self.row(
            "B's GET /v1/calibrations",
            "listed A's fits and domain tags",
            f"B lists {len(listed['B'])} fits, A lists {len(listed['A'])} (its own)",
            listed["B"] == [] and listed["A"] == [a_fit["id"]],
        )

        # B's feedback on twelve of A's decision ids, against an id never recorded.
        a_ids = [
            (await self.ask(A, f"Ticket {i}: I want my money back."))["x_reading"]["decision_id"]
            for i in range(12)
        ]
        theirs = [
            await self.client.post("/v1/feedback", json={"decision_id": d, "gold": False}, headers=auth(B))
            for d in a_ids
        ]
        unknown = await self.client.post(
            "/v1/feedback", json={"decision_id": "dec_never_recorded", "gold": False}, headers=auth(B)
        )
        same_as_unknown = all(
            r.json() == json.loads(unknown.text.replace("dec_never_recorded", d))
            for r, d in zip(theirs, a_ids)
        )
        own = await self.client.post(
            "/v1/feedback", json={"decision_id": a_ids[0], "gold": True}, headers=auth(A)
        )
        statuses = collections.Counter(r.status_code for r in theirs)
        self.row(
            "B's feedback on A's decision ids",
            "accepted, 12 of 12 × 200, overwrote A's gold",
            f"{', '.join(f'{n} × {s}' for s, n in statuses.items())}, body as for an unknown id: "
            f"{same_as_unknown}; A's own feedback after: {own.status_code}, gold_answers "
            f"{own.json().get('gold_answers')}",
            statuses == {404: 12}
            and unknown.status_code == 404
            and same_as_unknown
            and own.status_code == 200
            and own.json().get("gold_answers") == 1,
        )

        # B's own feedback (ten wrong labels) and a state_prior refit: fitted on B's records alone.
        a_before_refit = await self.ask(A, "Ticket 99: where is my parcel?")
        for i in range(10):
            mine = await self.ask(B, f"Ticket {i}: refund please?")
            sent = {"decision_id": mine["x_reading"]["decision_id"], "gold": False}
            (await self.client.post("/v1/feedback", json=sent, headers=auth(B))).raise_for_status()
        refit = {"question_type": "noul", "option_count": 2, "domain": DOMAIN}
        b_gold_refit = await self.client.post("/v1/calibrations/refit", json=refit, headers=auth(B))
        b_prior_refit = await self.client.post(
            "/v1/calibrations/refit", json=refit | {"mode": "state_prior"}, headers=auth(B)
        )
        a_after_refit = await self.ask(A, "Ticket 99: where is my parcel?")
        # B's with the domain: "Ticket 99" before and after A's fit, and the ten labelled (A has 15 more).
        b_decisions = 12
        self.row(
            "B's refits (gold and state_prior) move A's answer?",
            "yes: A's answer 0.480/0.520 → 0.293/0.707; B's refit on B's wrong labels (T = 20) put onto A",
            f"B's refits: {b_gold_refit.status_code} (n = {b_gold_refit.json().get('n')}, tenant "
            f"{b_gold_refit.json().get('tenant')}), state_prior {b_prior_refit.status_code} (n = "
            f"{b_prior_refit.json().get('n')} ; B made {b_decisions}, A 15); A's P(yes) "
            f"{a_before_refit['noul']:.4f} → {a_after_refit['noul']:.4f}",
            b_gold_refit.status_code == 200
            and b_gold_refit.json().get("n") == 10
            and b_prior_refit.status_code == 200
            and b_prior_refit.json().get("n", b_decisions + 1) <= b_decisions
            and a_after_refit["noul"] == a_before_refit["noul"]
            and a_after_refit["x_reading"]["calibration"]["id"] == a_fit["id"],
        )

    async def names(self) -> None:
        for label, options, then in (
            ("two 301-character option names", ["a" * 301, "b" * 301], "took 165 s"),
            (
                "two 10,000-character option names",
                ["a" * 10_000, "b" * 10_000],
                "still running at 120 s (≈ 1 h)",
            ),
            (
                "option names of 50 and 40 tokens (199 characters each)",
                [" ".join(["red"] * 50)[:199], " ".join(["blue"] * 40)[:199]],
                "each token one sequential engine call",
            ),
        ):
            response, took = await self.timed(
                "POST", "/v1/systemone", json=one_choice(options), headers=auth(A)
            )
            self.row(
                label,
                then,
                f"{response.status_code} in {ms(took)}: {reason(response)}",
                response.status_code == 422 and took < 1.0,
            )
        for label, name, then in (
            ("empty question name", "", "accepted"),
            ("10,000-character question name", "q" * 10_000, "accepted"),
        ):
            body = {"state": "A fruit bowl.", "questions": {name: NOUL}}
            response, took = await self.timed("POST", "/v1/systemone", json=body, headers=auth(A))
            self.row(
                label,
                then,
                f"{response.status_code} in {ms(took)}: {reason(response)}",
                response.status_code == 422,
            )

    async def strictness(self) -> None:
        for label, options in (
            ("look-alike options `Ａ` / `A`", ["A", "\uff21", "B"]),
            ("zero-width space inside an option name", ["apple", "ap\u200bple", "pear"]),
        ):
            response = await self.client.post("/v1/systemone", json=one_choice(options), headers=auth(A))
            self.row(
                label, "accepted", f"{response.status_code}: {reason(response)}", response.status_code == 422
            )
        body = {"state": "Café crème", "questions": {"q": NOUL}}
        response = await self.client.post(
            "/v1/systemone",
            content=json.dumps(body, ensure_ascii=False).encode("utf-16"),
            headers=auth(A) | {"content-type": "application/json"},
        )
        self.row("UTF-16 body", "accepted (docs say UTF-8 only)", f"{response.status_code}: {reason(response)}",
                 response.status_code == 415)  # fmt: skip

    async def calibration_admission(self, tokens_per_state: int) -> None:
        """A 73,073-token example set (the issue's size) on POST /v1/calibrations and the same reads on
        /decide/batch, with a small decision sent at the same time."""
        question = {"type": "noul", "instructions": "Is it about a refund?"}
        states = [f"Example {i}:" + " word" * tokens_per_state for i in range(12)]
        body = {
            "examples": [
                {"state": s, "questions": {"q": question}, "gold": {"q": i % 2 == 0}}
                for i, s in enumerate(states)
            ]
        }
        small_state = "Ticket 7: the parcel came late."
        fit, small = await asyncio.gather(
            self.timed("POST", "/v1/calibrations", json=body, headers=auth(A)),
            self.timed(
                "POST",
                "/v1/systemone",
                json={"state": small_state, "questions": {"q": NOUL}},
                headers=auth(B),
            ),
        )
        batch, batch_took = await self.timed(
            "POST", "/decide/batch", json={"states": states, "questions": {"q": question}}, headers=auth(A)
        )
        (fit_response, fit_took), (small_response, small_took) = fit, small
        self.row(
            "POST /v1/calibrations, 12 examples ≈ 73,000 tokens",
            "accepted (413 on /decide/batch); a small decision meanwhile took 31.3 s instead of ~1 s",
            f"{fit_response.status_code} in {ms(fit_took)}: {reason(fit_response)}; /decide/batch "
            f"{batch.status_code} in {ms(batch_took)}; the small decision meanwhile {small_response.status_code} in "
            f"{ms(small_took)}",
            fit_response.status_code == 413
            and batch.status_code == 413
            and small_response.status_code == 200
            and small_took < 5,
        )

    async def metrics(self) -> None:
        plain = await self.client.get("/metrics", headers=auth(A))
        admin = await self.client.get("/metrics", headers=auth(ADMIN))
        async with httpx.AsyncClient(base_url=self.metrics_url, timeout=30) as alone:
            own_port = await alone.get("/metrics")
        self.row(
            "/metrics without an admin key; on --metrics-port",
            "needed a decision key; no metrics port",
            f"main port: decide key {plain.status_code} ({reason(plain)[:60]}), admin key {admin.status_code}; "
            f"--metrics-port, no key: {own_port.status_code}",
            plain.status_code == 403
            and admin.status_code == 200
            and own_port.status_code == 200
            and b"decide_requests_total" in own_port.content,
        )

    async def rotation(self) -> None:
        body = one_choice(["x", "y"], state="Rotation check.")

        async def status(key: str) -> int:
            return (await self.client.post("/v1/systemone", json=body, headers=auth(key))).status_code

        before = {who: await status(k) for who, k in (("A", A), ("B", B), ("C", C))}
        self.keys.write_text(ROTATED)
        started = time.monotonic()
        while await status(C) != 200 and time.monotonic() - started < 30:
            await asyncio.sleep(0.2)
        polled_s = time.monotonic() - started
        after_poll = {who: await status(k) for who, k in (("A", A), ("B", B), ("C", C))}
        # Back to the first set, reloaded by SIGHUP (no wait for the poll).
        self.keys.write_text(KEY_FILE)
        self.server.send_signal(signal.SIGHUP)
        started = time.monotonic()
        while await status(B) != 200 and time.monotonic() - started < 30:
            await asyncio.sleep(0.05)
        hup_s = time.monotonic() - started
        after_hup = {who: await status(k) for who, k in (("A", A), ("B", B), ("C", C))}
        self.row(
            "key change without restart",
            "only by restart",
            f"file rewritten (B's key {key_id(digest(B))} out, C's {key_id(digest(C))} in): A/B/C "
            f"{'/'.join(map(str, before.values()))} → {'/'.join(map(str, after_poll.values()))} after "
            f"{polled_s:.1f} s (poll); restored + SIGHUP → {'/'.join(map(str, after_hup.values()))} after "
            f"{hup_s:.2f} s; server pid unchanged, alive: {self.server.poll() is None}",
            before == {"A": 200, "B": 200, "C": 401}
            and after_poll == {"A": 200, "B": 401, "C": 200}
            and after_hup == {"A": 200, "B": 200, "C": 401}
            and self.server.poll() is None,
        )

    async def memory(self, sentences: int, baseline_mib: float) -> None:
        state = "Order notes:" + " The parcel came late and the box was torn." * sentences
        questions = {
            "refund": NOUL,
            "angry": OTHER_NOUL,
            "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "shipping": None, "support": None}},
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["not urgent", "soon", "right now"]},
        }  # fmt: skip
        before = rss_mib(self.server.pid)
        response, took = await self.timed(
            "POST", "/v1/systemone", json={"state": state, "questions": questions}, headers=auth(A)
        )
        after = rss_mib(self.server.pid)
        tokens = (
            max(a["x_reading"]["prompt_tokens"] for a in response.json()["answers"].values())
            if response.status_code == 200
            else None
        )
        self.row(
            "resident memory, one long state with 4 questions",
            "raised it by 1.8–2.0 GiB (5,040-token state); baseline grew 1.0 → ~3.0 GiB over the probe",
            f"{response.status_code} in {ms(took)}, longest prompt {tokens} tokens; RSS {before:.0f} → {after:.0f} MiB "
            f"(+{after - before:.0f}); at start {baseline_mib:.0f} MiB",
            response.status_code == 200 and after - before < 512,
        )

    async def overload(self, n: int, padding_tokens: int = 0) -> dict:
        """``n`` concurrent one-question requests, each state distinct; ``padding_tokens`` lengthen every
        state so that the flood's work exceeds the queue's bound (529s to time).

        The flood comes from its own client, each request on a new connection, as ``n`` callers send it.
        Sent through the probe's one pool of ``n`` kept-alive connections (after the first flood), the
        client itself took seconds to put the requests on the wire (httpcore walks its idle connections
        for each request) while the engine held the cores: the server then saw the last of them ~3 s
        late and refused each within milliseconds, and the row measured the client. The server's own
        time per request, from its access log, is printed beside the client's."""

        async def one(client: httpx.AsyncClient, i: int) -> tuple[int, float, str | None, str | None]:
            state = f"Flood {i}: my order {i * 7919 % 10_000} is late." + " word" * padding_tokens
            body = {"state": state, "questions": {"q": NOUL}}
            started = time.monotonic()
            response = await client.post("/v1/systemone", json=body, headers=auth(A if i % 2 else B))
            return (
                response.status_code,
                time.monotonic() - started,
                response.headers.get("retry-after"),
                response.headers.get("x-request-id"),
            )

        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.client.base_url, timeout=300, limits=limits) as client:
            started = time.monotonic()
            results = await asyncio.gather(*(one(client, i) for i in range(n)))
            wall = time.monotonic() - started
        statuses = collections.Counter(s for s, *_ in results)
        answered = sorted(t for s, t, *_ in results if s == 200)
        refused = sorted(t for s, t, *_ in results if s == 529)
        retry_after = collections.Counter(r for s, _, r, _ in results if s == 529)
        served = self.server_latencies_s()
        refused_served = sorted(served[rid] for s, _, _, rid in results if s == 529 and rid in served)

        def pct(values: list[float], q: float) -> str:
            return ms(values[min(len(values) - 1, int(q * len(values)))]) if values else "–"

        self.row(
            f"overload: {n} concurrent one-question requests"
            + (f", states padded by {padding_tokens} tokens" if padding_tokens else ""),
            "151 × 200 (p50 110 s, p99 191 s), 49 × 529 (Retry-After 2) after 1.8–2.1 s"
            if not padding_tokens
            else "(not asked: the issue's flood had short states)",
            f"{', '.join(f'{c} × {s}' for s, c in sorted(statuses.items()))}; 200s p50 {pct(answered, 0.5)}, p99 "
            f"{pct(answered, 0.99)}; 529s after p50 {pct(refused, 0.5)}, max {pct(refused, 1.0)} at the client, "
            f"p50 {pct(refused_served, 0.5)}, max {pct(refused_served, 1.0)} in the server (Retry-After "
            f"{', '.join(f'{r} × {c}' for r, c in retry_after.items()) or '–'}); all done in {ms(wall)}",
            set(statuses) <= {200, 529, 504}
            and bool(answered)
            and (not refused or refused[-1] < 1.0)
            and answered[-1] < 65,
        )
        return {"statuses": dict(statuses), "wall_s": wall}

    def server_latencies_s(self) -> dict[str, float]:
        """Request id → the server's own latency (its access-log lines: service/observe.py)."""
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

    def covered_by_tests(self) -> None:
        for probe, then, test in (
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
            self.row(probe, then, f"not re-run here: see {test}", None)


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


async def probe(args: argparse.Namespace, folder: Path) -> list[Row]:
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
            checks = Probe(client, server, keys, f"http://127.0.0.1:{metrics_port}", log)
            for step in (
                checks.wrong_keys,
                checks.isolation,
                checks.names,
                checks.strictness,
                lambda: checks.calibration_admission(args.example_state_tokens),
                checks.metrics,
                checks.rotation,
                lambda: checks.memory(args.long_state_sentences, baseline),
                lambda: checks.overload(args.concurrency),
                lambda: checks.overload(args.concurrency, args.flood_padding_tokens),
            ):
                print(f"{datetime.now(UTC):%H:%M:%S} {getattr(step, '__name__', 'step')}", file=sys.stderr)
                await step()
            checks.row(
                "resident memory over the whole probe",
                "baseline grew 1.0 → ~3.0 GiB and was not released",
                f"{baseline:.0f} MiB at start → {rss_mib(server.pid):.0f} MiB at the end",
                rss_mib(server.pid) < baseline + 1024,
            )
            checks.covered_by_tests()
        server_errors = [line for line in log.read_text(errors="replace").splitlines() if "Traceback" in line]
        checks.row(
            "server log", "–", f"{len(server_errors)} tracebacks in the server's log", not server_errors
        )
        return checks.rows
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        rows = asyncio.run(probe(args, Path(folder)))
    print(f"# Issue 29's probe, re-run ({started:%Y-%m-%d %H:%M} UTC, commit {git_commit()})\n")
    print(f"`bench/probe.py {' '.join(sys.argv[1:])}`: {vars(args)}; embedded engine (SmolLM2-135M-Instruct, "
          f"local), {os.cpu_count()} cores; server defaults (deadline, admission) unchanged.\n")  # fmt: skip
    print(table(rows))
    failed = [r.probe for r in rows if r.passed is False]
    print(f"\n{sum(r.passed is True for r in rows)} PASS, {len(failed)} FAIL, "
          f"{sum(r.passed is None for r in rows)} covered by tests; {(datetime.now(UTC) - started).total_seconds():.0f} s")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
