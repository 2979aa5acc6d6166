"""The probe's rows on keys and tenants: wrong keys refused, one tenant's fits, feedback and refits kept
from another's answers, metrics behind an admin key or their own port, keys rotated without a restart."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import time

import httpx

from deploy.acceptance.probe.session import (
    ADMIN,
    DOMAIN,
    KEY_FILE,
    NOISE,
    OTHER_NOUL,
    ROTATED,
    A,
    B,
    C,
    Probe,
    auth,
    examples,
    one_choice,
    reason,
)
from service.keys import digest, key_id


async def wrong_keys(probe: Probe) -> None:
    statuses = collections.Counter()
    for headers in ({}, auth("not-a-key-0123456789abcdef"), {"authorization": A}, auth(A[:-1])):
        response = await probe.client.post("/v1/systemone", json=one_choice(["x", "y"]), headers=headers)
        statuses[response.status_code] += 1
    probe.row(
        "wrong or missing key (4 kinds)",
        "401 for every wrong key (held)",
        ", ".join(f"{n} × {s}" for s, n in sorted(statuses.items())),
        set(statuses) == {401},
    )


async def isolation(probe: Probe) -> None:
    b_before = await probe.ask(B, "Ticket 99: where is my parcel?")
    b_other_before = await probe.ask(B, "Ticket 98: nobody answers my mails.", OTHER_NOUL, domain=None)
    fitted = await probe.client.post("/v1/calibrations", json=examples(12, flip=True), headers=auth(A))
    fitted.raise_for_status()
    (a_fit,) = fitted.json()["calibrations"]
    a_answer = await probe.ask(A, "Ticket 99: where is my parcel?")
    b_after = await probe.ask(B, "Ticket 99: where is my parcel?")
    b_other_after = await probe.ask(B, "Ticket 98: nobody answers my mails.", OTHER_NOUL, domain=None)
    a_used = (a_answer["x_reading"]["calibration"] or {}).get("id")
    # Unchanged up to float noise: a state read again reuses its cached keys and values (the local
    # engine's prefix cache), which sums in another order; the issue's leak moved B's answer by 0.034.
    unchanged = (
        b_after["x_reading"]["calibration"] is None
        and b_other_after["x_reading"]["calibration"] is None
        and abs(b_after["noul"] - b_before["noul"]) < NOISE
        and abs(b_other_after["noul"] - b_other_before["noul"]) < NOISE
    )
    probe.row(
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
            for c in (await probe.client.get("/v1/calibrations", headers=auth(k))).json()["calibrations"]
        ]
        for who, k in (("A", A), ("B", B))
    }
    probe.row(
        "B's GET /v1/calibrations",
        "listed A's fits and domain tags",
        f"B lists {len(listed['B'])} fits, A lists {len(listed['A'])} (its own)",
        listed["B"] == [] and listed["A"] == [a_fit["id"]],
    )

    # B's feedback on twelve of A's decision ids, against an id never recorded.
    a_ids = [
        (await probe.ask(A, f"Ticket {i}: I want my money back."))["x_reading"]["decision_id"]
        for i in range(12)
    ]
    theirs = [
        await probe.client.post("/v1/feedback", json={"decision_id": d, "gold": False}, headers=auth(B))
        for d in a_ids
    ]
    unknown = await probe.client.post(
        "/v1/feedback", json={"decision_id": "dec_never_recorded", "gold": False}, headers=auth(B)
    )
    same_as_unknown = all(
        r.json() == json.loads(unknown.text.replace("dec_never_recorded", d)) for r, d in zip(theirs, a_ids)
    )
    own = await probe.client.post(
        "/v1/feedback", json={"decision_id": a_ids[0], "gold": True}, headers=auth(A)
    )
    statuses = collections.Counter(r.status_code for r in theirs)
    probe.row(
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
    a_before_refit = await probe.ask(A, "Ticket 99: where is my parcel?")
    for i in range(10):
        mine = await probe.ask(B, f"Ticket {i}: refund please?")
        sent = {"decision_id": mine["x_reading"]["decision_id"], "gold": False}
        (await probe.client.post("/v1/feedback", json=sent, headers=auth(B))).raise_for_status()
    refit = {"question_type": "noul", "option_count": 2, "domain": DOMAIN}
    b_gold_refit = await probe.client.post("/v1/calibrations/refit", json=refit, headers=auth(B))
    b_prior_refit = await probe.client.post(
        "/v1/calibrations/refit", json=refit | {"mode": "state_prior"}, headers=auth(B)
    )
    a_after_refit = await probe.ask(A, "Ticket 99: where is my parcel?")
    # B's with the domain: "Ticket 99" before and after A's fit, and the ten labelled (A has 15 more).
    b_decisions = 12
    probe.row(
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


async def metrics(probe: Probe) -> None:
    plain = await probe.client.get("/metrics", headers=auth(A))
    admin = await probe.client.get("/metrics", headers=auth(ADMIN))
    async with httpx.AsyncClient(base_url=probe.metrics_url, timeout=30) as alone:
        own_port = await alone.get("/metrics")
    probe.row(
        "/metrics without an admin key; on --metrics-port",
        "needed a decision key; no metrics port",
        f"main port: decide key {plain.status_code} ({reason(plain)[:60]}), admin key {admin.status_code}; "
        f"--metrics-port, no key: {own_port.status_code}",
        plain.status_code == 403
        and admin.status_code == 200
        and own_port.status_code == 200
        and b"decide_requests_total" in own_port.content,
    )


async def rotation(probe: Probe) -> None:
    body = one_choice(["x", "y"], state="Rotation check.")

    async def status(key: str) -> int:
        return (await probe.client.post("/v1/systemone", json=body, headers=auth(key))).status_code

    before = {who: await status(k) for who, k in (("A", A), ("B", B), ("C", C))}
    probe.keys.write_text(ROTATED)
    started = time.monotonic()
    while await status(C) != 200 and time.monotonic() - started < 30:
        await asyncio.sleep(0.2)
    polled_s = time.monotonic() - started
    after_poll = {who: await status(k) for who, k in (("A", A), ("B", B), ("C", C))}
    # Back to the first set, reloaded by SIGHUP (no wait for the poll).
    probe.keys.write_text(KEY_FILE)
    probe.server.send_signal(signal.SIGHUP)
    started = time.monotonic()
    while await status(B) != 200 and time.monotonic() - started < 30:
        await asyncio.sleep(0.05)
    hup_s = time.monotonic() - started
    after_hup = {who: await status(k) for who, k in (("A", A), ("B", B), ("C", C))}
    probe.row(
        "key change without restart",
        "only by restart",
        f"file rewritten (B's key {key_id(digest(B))} out, C's {key_id(digest(C))} in): A/B/C "
        f"{'/'.join(map(str, before.values()))} → {'/'.join(map(str, after_poll.values()))} after "
        f"{polled_s:.1f} s (poll); restored + SIGHUP → {'/'.join(map(str, after_hup.values()))} after "
        f"{hup_s:.2f} s; server pid unchanged, alive: {probe.server.poll() is None}",
        before == {"A": 200, "B": 200, "C": 401}
        and after_poll == {"A": 200, "B": 401, "C": 200}
        and after_hup == {"A": 200, "B": 200, "C": 401}
        and probe.server.poll() is None,
    )
