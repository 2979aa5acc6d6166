"""What another tenant's latency says about tenant a's text (issue 40), measured side by side.

    .venv/bin/python -m bench.cache_isolation               # 15 rounds
    .venv/bin/python -m bench.cache_isolation --rounds 5

The real service in this process (``service.app.create_app`` over ``httpx.ASGITransport``), the
embedded model with its prefix cache, a key file with tenants a and b. Each round: a sends a new
~200-token state holding a secret; then, in an order that alternates each round, b sends a's exact
state, b sends a fresh state of the same shape, and a sends its own state again. Printed per kind:
the median latency with its range and the median ``tokens_reused``. With caches per tenant, b's read
of a's state should cost what its fresh state costs (same work, same reuse), and a's own read again
much less. One request at a time; no timed assertion anywhere (the cores may be shared: say so next
to any figure).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from service.app import create_app
from service.keys import Keyring

A = "bench-tenant-a-0123456789abcdef"
B = "bench-tenant-b-0123456789abcdef"
NOUL = {"type": "noul", "instructions": "Does the customer ask for money back?"}
BODY = (
    "Account {tag}: the customer's PIN is {pin}. They wrote on Monday about an order of a blue kettle, "
    "two mugs and a tea strainer, paid by card, sent by standard delivery to a flat on the third floor. "
    "The courier marked it delivered on Wednesday, but nobody was home and the parcel is not in the "
    "building's post room. The customer asks where it is and whether it can be sent again this week."
)


async def timed(client: httpx.AsyncClient, key: str, state: str) -> tuple[float, int]:
    started = time.perf_counter()
    response = await client.post(
        "/v1/systemone",
        json={"state": state, "questions": {"q": NOUL}},
        headers={"authorization": f"Bearer {key}"},
    )
    took = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return took, response.json()["answers"]["q"]["x_reading"]["tokens_reused"]


async def run(rounds: int) -> dict[str, list[tuple[float, int]]]:
    with tempfile.TemporaryDirectory() as folder:
        keys = Path(folder) / "keys.txt"
        keys.write_text(f"{A} tenant=a\n{B} tenant=b\n")
        engine = LocalEngine(prepare_embedded_model())
        app = create_app(engine, api_keys=Keyring(keys, {}))
        results: dict[str, list[tuple[float, int]]] = {"b reads a's state": [], "b reads a fresh state": [], "a reads its own again": []}  # fmt: skip
        stamp = time.time_ns()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120) as client:  # fmt: skip
                for warm in (A, B):  # each tenant's system prompt and question in its own cache
                    await timed(client, warm, BODY.format(tag=f"warm-{stamp}", pin="0000"))
                for i in range(rounds):
                    secret = BODY.format(tag=f"{stamp}-{i}", pin=f"{4829 + i:04d}")
                    fresh = BODY.format(tag=f"{stamp}-{i}-fresh", pin=f"{1093 + i:04d}")
                    await timed(client, A, secret)
                    kinds = [("b reads a's state", B, secret), ("b reads a fresh state", B, fresh), ("a reads its own again", A, secret)]  # fmt: skip
                    for kind, key, state in kinds if i % 2 == 0 else kinds[1::-1] + kinds[2:]:
                        results[kind].append(await timed(client, key, state))
        finally:
            await engine.aclose()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.rounds))
    print(f"{args.rounds} rounds, embedded engine, one request at a time")
    print("| read | median ms | range ms | median tokens_reused |")
    print("|---|---|---|---|")
    for kind, rows in results.items():
        times = [t for t, _ in rows]
        print(
            f"| {kind} | {statistics.median(times):.0f} | {min(times):.0f}–{max(times):.0f} | "
            f"{statistics.median(r for _, r in rows):.0f} |"
        )


if __name__ == "__main__":
    main()
