"""The probe's rows on bounds: long and odd names refused at once, bodies read strictly, a huge example set
refused before it takes the cores, memory after one long state, and two floods of concurrent requests."""

from __future__ import annotations

import asyncio
import collections
import json
import time

import httpx

from deploy.acceptance.probe.session import (
    NOUL,
    OTHER_NOUL,
    A,
    B,
    Probe,
    auth,
    ms,
    one_choice,
    reason,
    rss_mib,
)


async def names(probe: Probe) -> None:
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
        response, took = await probe.timed("POST", "/v1/systemone", json=one_choice(options), headers=auth(A))
        probe.row(
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
        response, took = await probe.timed("POST", "/v1/systemone", json=body, headers=auth(A))
        probe.row(
            label,
            then,
            f"{response.status_code} in {ms(took)}: {reason(response)}",
            response.status_code == 422,
        )


async def strictness(probe: Probe) -> None:
    for label, options in (
        ("look-alike options `Ａ` / `A`", ["A", "\uff21", "B"]),
        ("zero-width space inside an option name", ["apple", "ap\u200bple", "pear"]),
    ):
        response = await probe.client.post("/v1/systemone", json=one_choice(options), headers=auth(A))
        probe.row(
            label, "accepted", f"{response.status_code}: {reason(response)}", response.status_code == 422
        )
    body = {"state": "Café crème", "questions": {"q": NOUL}}
    response = await probe.client.post(
        "/v1/systemone",
        content=json.dumps(body, ensure_ascii=False).encode("utf-16"),
        headers=auth(A) | {"content-type": "application/json"},
    )
    probe.row("UTF-16 body", "accepted (docs say UTF-8 only)", f"{response.status_code}: {reason(response)}",
             response.status_code == 415)  # fmt: skip


async def calibration_admission(probe: Probe, tokens_per_state: int) -> None:
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
        probe.timed("POST", "/v1/calibrations", json=body, headers=auth(A)),
        probe.timed(
            "POST",
            "/v1/systemone",
            json={"state": small_state, "questions": {"q": NOUL}},
            headers=auth(B),
        ),
    )
    batch, batch_took = await probe.timed(
        "POST", "/decide/batch", json={"states": states, "questions": {"q": question}}, headers=auth(A)
    )
    (fit_response, fit_took), (small_response, small_took) = fit, small
    probe.row(
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


async def memory(probe: Probe, sentences: int, baseline_mib: float) -> None:
    state = "Order notes:" + " The parcel came late and the box was torn." * sentences
    questions = {
        "refund": NOUL,
        "angry": OTHER_NOUL,
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "shipping": None, "support": None}},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["not urgent", "soon", "right now"]},
    }  # fmt: skip
    before = rss_mib(probe.server.pid)
    response, took = await probe.timed(
        "POST", "/v1/systemone", json={"state": state, "questions": questions}, headers=auth(A)
    )
    after = rss_mib(probe.server.pid)
    tokens = (
        max(a["x_reading"]["prompt_tokens"] for a in response.json()["answers"].values())
        if response.status_code == 200
        else None
    )
    probe.row(
        "resident memory, one long state with 4 questions",
        "raised it by 1.8–2.0 GiB (5,040-token state); baseline grew 1.0 → ~3.0 GiB over the probe",
        f"{response.status_code} in {ms(took)}, longest prompt {tokens} tokens; RSS {before:.0f} → {after:.0f} MiB "
        f"(+{after - before:.0f}); at start {baseline_mib:.0f} MiB",
        response.status_code == 200 and after - before < 512,
    )


async def overload(probe: Probe, n: int, padding_tokens: int = 0) -> dict:
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
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=300, limits=limits) as client:
        started = time.monotonic()
        results = await asyncio.gather(*(one(client, i) for i in range(n)))
        wall = time.monotonic() - started
    statuses = collections.Counter(s for s, *_ in results)
    answered = sorted(t for s, t, *_ in results if s == 200)
    refused = sorted(t for s, t, *_ in results if s == 529)
    retry_after = collections.Counter(r for s, _, r, _ in results if s == 529)
    served = probe.server_latencies_s()
    refused_served = sorted(served[rid] for s, _, _, rid in results if s == 529 and rid in served)

    def pct(values: list[float], q: float) -> str:
        return ms(values[min(len(values) - 1, int(q * len(values)))]) if values else "–"

    probe.row(
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
