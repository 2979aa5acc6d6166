"""The scenarios where one caller's work crowds out another's: an abandoned batch that skews the measured
rate, a flooding tenant beside a polite one, a 255-option question beside small requests."""

from __future__ import annotations

import asyncio
import time

import httpx

from deploy.acceptance.fairness.session import (
    Fairness,
    Sizes,
    counts,
    paced,
    pct,
    say,
    small,
    summary,
    warm_up,
    words,
)
from deploy.acceptance.probe.session import NOUL, A, B, auth, ms, one_choice, reason


async def abandoned_batch(probe: Fairness, sizes: Sizes) -> None:
    states = [words(f"Batch {i}", sizes.abandoned_words) for i in range(sizes.abandoned_states)]
    body = {"states": states, "questions": {"q": NOUL}}
    try:
        response = await probe.client.post("/decide/batch", json=body, headers=auth(A), timeout=5)
        left = f"answered {response.status_code} within 5 s"
    except httpx.TimeoutException:
        left = "abandoned at 5 s"
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


IN_FLIGHT = "in flight at the end"
"""A flood batch neither answered nor refused when the polite tenant was done, then abandoned."""


async def flood(
    probe: Fairness, sizes: Sizes, stop: asyncio.Event
) -> tuple[list[tuple[int | str, float, str]], list[int]]:
    """Tenant a's loops of large batches from one client until ``stop``: each batch's status, time and
    refusal reason, and the batch size each loop ended at.

    A batch refused as too large (413) is halved and sent again, as a client told so would split it: a
    server that prices a batch past its deadline refuses the issue's 40 × 900 words by design, and the
    flood must still be work the server takes on, or the polite tenant is measured beside nothing. A
    batch refused as overloaded (529) is sent again after its Retry-After: refusals sent back to back
    would load the cores with their own parsing and measure that instead."""
    states = [words(f"Flood {i}", sizes.flood_words) for i in range(sizes.flood_states)]
    results: list[tuple[int | str, float, str]] = []
    sizes_now = [len(states)] * sizes.flood_loops
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as client:

        async def loop(n: int) -> None:
            while not stop.is_set():
                batch = [f"{n}-{len(results)} {s}" for s in states[: sizes_now[n]]]
                started = time.monotonic()
                try:
                    response = await client.post(
                        "/decide/batch", json={"states": batch, "questions": {"q": NOUL}}, headers=auth(A)
                    )
                except httpx.TransportError as error:
                    results.append((type(error).__name__, time.monotonic() - started, ""))
                    continue
                except asyncio.CancelledError:  # still read or queued when b was done: taken on
                    results.append((IN_FLIGHT, time.monotonic() - started, ""))
                    raise
                refused = response.status_code in (413, 529)
                results.append(
                    (response.status_code, time.monotonic() - started, reason(response) if refused else "")
                )
                if response.status_code == 413 and sizes_now[n] > 1:
                    sizes_now[n] //= 2
                elif refused:
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))

        loops = [asyncio.ensure_future(loop(n)) for n in range(sizes.flood_loops)]
        await stop.wait()
        for each in loops:  # the batches in flight are abandoned: their connections close
            each.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    return results, sizes_now


async def polite_beside_flood(probe: Fairness, sizes: Sizes) -> None:
    await warm_up(probe, sizes)
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as b_client:
        alone = await paced(b_client, B, sizes.polite_alone, sizes.polite_every_s, 100)
        say(f"- polite tenant b alone, one request every {sizes.polite_every_s:g} s: {summary(alone)}")
        stop = asyncio.Event()
        flooding = asyncio.ensure_future(flood(probe, sizes, stop))
        await asyncio.sleep(3)  # the flood's first batches are in flight and queued
        flooded = await paced(b_client, B, sizes.polite_flooded, sizes.polite_every_s, 200)
        stop.set()
        a_results, a_sizes = await flooding
    say(f"- polite tenant b beside the flood: {summary(flooded)}")
    say(
        f"- flooding tenant a, {sizes.flood_loops} loops of {sizes.flood_states} × {sizes.flood_words}-word "
        f"/decide/batch, ending at {' and '.join(map(str, a_sizes))} states: {summary(a_results)}"
    )
    alone_p99 = pct([t for s, t, _ in alone if s == 200] or [float("inf")], 0.99)
    answered = [t for s, t, _ in flooded if s == 200]
    refused = sum(s == 529 for s, _, _ in flooded)
    flooded_p99 = pct(answered, 0.99) if answered else float("inf")
    # A flood refused whole (413) never competed with b: the row then says so and fails.
    admitted = sum(s in (200, 504, IN_FLIGHT) for s, _, _ in a_results)
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
    await warm_up(probe, sizes)
    async with httpx.AsyncClient(base_url=probe.client.base_url, timeout=70) as b_client:
        big = asyncio.ensure_future(probe.timed("POST", "/v1/systemone", json=question, headers=auth(A)))
        await asyncio.sleep(0.2)  # the wide question is priced and admitted first
        smalls = await paced(b_client, B, sizes.choice_small, 0.05, 300)
        (response, took) = await big
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
        f"the question {response.status_code} in {ms(took)}; small: {counts(statuses)}"
        + ("" if response.status_code == 200 else " (the question was never in flight)"),
        "the question answered; every small request answered, none 529",
        response.status_code == 200 and all(s == 200 for s in statuses),
    )
