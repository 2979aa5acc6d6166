"""Both decision routes on the same requests: latency per question count, and its ratio to 1 question.

    .venv/bin/python -m bench.two_routes                 # 1, 10, 100, 400 questions, 3 repeats
    .venv/bin/python -m bench.two_routes --sizes 1 10 --repeats 1

For each size n, n yes/no questions (``noul`` on ``/v1/systemone``, ``predicate`` on
``/v1/decisions``, the same instructions) about one ~150-token input, through the real service in this
process (``service.app.create_app`` over ``httpx.ASGITransport``, the embedded model, the default
prior correction, no store). Each request reads an input tagged with the run's start time, the
size, the route and the repeat, so no request finds another's state in the engine's cache: each does
the same fresh work. Each size is asked ``--repeats`` times per route, the routes alternating which
goes first, and the median is shown with the range. Both routes take up to ``MAX_QUESTIONS`` (400); a size
either refuses shows "refused" with the status it answered. Admission runs with the service's defaults (``AdmissionLimits()``):
400 questions on this input are priced at the ~11,600 tokens the engine computes (the state once), within
them. ``--request-cost`` raises the per-request cap alone, to try a longer ``INPUT``.

Printed per row: the route, n, the status, the median latency (ms) and its range, the ratio to the
same route's 1-question median, and the OpenAI route's median ÷ the Jev route's at the same n. One request at a time; no
timed assertion anywhere (the machine's cores may be shared: say so next to any figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx

from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from service.admission import AdmissionLimits
from service.app import create_app
from service.protocol import MAX_QUESTIONS

INPUT = (
    "Order 4417 was placed on Monday for a blue kettle, two mugs and a tea strainer. The customer paid "
    "by card and chose standard delivery to a flat on the third floor. On Wednesday the courier marked "
    "the parcel as delivered, but the customer wrote on Thursday that nothing had arrived, that the "
    "building has no concierge, and that a neighbour saw a box left by the bins in the rain. The "
    "customer asks for a replacement or a refund and says they have ordered from the shop for years "
    "without a problem. They attached no photo and did not say which day they checked the bins."
)


def questions(n: int) -> list[str]:
    return [f"Statement {i}: the customer mentions item or fact number {i} of the order." for i in range(n)]


async def one(client: httpx.AsyncClient, route: str, n: int, tag: str) -> tuple[int, float]:
    state = f"[{tag}] {INPUT}"
    texts = questions(n)
    if route == "jev":
        body = {
            "state": state,
            "questions": {str(i): {"type": "noul", "instructions": t} for i, t in enumerate(texts)},
        }
        path = "/v1/systemone"
    else:
        body = {
            "model": "gpt-6-luna",
            "input": state,
            "questions": [{"type": "predicate", "instructions": t} for t in texts],
        }
        path = "/v1/decisions"
    started = time.monotonic()
    response = await client.post(path, json=body)
    return response.status_code, (time.monotonic() - started) * 1000


async def main(sizes: list[int], request_cost: int, repeats: int, engine: LocalEngine | None = None) -> None:
    """The run, printed; ``engine``: the embedded model already loaded (tests), else loaded here."""
    run = time.strftime("%Y%m%dT%H%M%S")
    engine = engine or LocalEngine(prepare_embedded_model())
    app = create_app(engine, admission=AdmissionLimits(request_cost=request_cost))
    print(json.dumps({"bench": "two_routes", "run": run, "sizes": sizes, "repeats": repeats, "request_cost": request_cost,
                      "engine": engine.kind, "model": engine.info.name, "input_chars": len(INPUT),
                      "input_tokens": len(engine.tokenizer.encode(INPUT)), "max_questions": MAX_QUESTIONS}))  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench.test", timeout=3600) as client:
        # One read before timing: the model loaded and the system prompt's keys kept, for both routes.
        await one(client, "jev", 1, f"{run}-warm")
        results: dict[tuple[str, int], tuple[int, list[float]]] = {}
        for n in sizes:
            for repeat in range(repeats):
                order = ("jev", "openai") if repeat % 2 == 0 else ("openai", "jev")
                for route in order:
                    status, ms = await one(client, route, n, f"{run}-{route}-{n}-{repeat}")
                    previous = results.setdefault((route, n), (status, []))
                    results[route, n] = (max(previous[0], status), [*previous[1], ms])
                if repeat == 0 and 200 not in (results["jev", n][0], results["openai", n][0]):
                    break  # refused: once is enough, and the other route once too
    print(
        f"{'route':7} {'n':>4} {'status':>6} {'median_ms':>10} {'range_ms':>19} {'x_1q':>6} {'openai/jev':>10}"
    )
    median = {key: statistics.median(times) for key, (_, times) in results.items()}
    for n in sizes:
        for route in ("jev", "openai"):
            status, times = results[route, n]
            base = results.get((route, sizes[0]))
            ok = status == 200
            ratio = (
                f"{median[route, n] / median[route, sizes[0]]:6.2f}"
                if ok and base and base[0] == 200
                else "     -"
            )
            both = ok and results["jev", n][0] == 200
            versus = (
                f"{median[route, n] / median['jev', n]:10.3f}" if route == "openai" and both else " " * 10
            )
            shown = (
                f"{median[route, n]:10.1f} {f'{min(times):.0f}-{max(times):.0f}':>19}"
                if ok
                else f"{'refused':>10} {'':>19}"
            )
            print(f"{route:7} {n:4d} {status:6d} {shown} {ratio} {versus}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 400])
    parser.add_argument(
        "--request-cost",
        type=int,
        default=AdmissionLimits.request_cost,
        help="admission's per-request cost cap",
    )
    parser.add_argument("--repeats", type=int, default=3, help="requests per size and route (median shown)")
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.request_cost, args.repeats))
