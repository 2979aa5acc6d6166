"""A soak: the service on the embedded engine under three tenants' mixed traffic for a fixed time.

The service is the real app on a real uvicorn server in this process (loopback HTTP), the embedded
model in process, a real SQLite store file, and a key file with three keys, one per tenant
(``KEY tenant=t0 scopes=decide,calibrate``…; service/keys.py), so each tenant's records, feedback and
fits are its own. Each tenant runs ``--clients`` loops; each loop picks its next request at random
(seeded): decisions of every question type on Jev's route and on OpenAI's ``POST /v1/decisions``,
batches, feedback on the tenant's own earlier decisions (a few at a time, on one question type, so a
key reaches the ``MIN_GOLD`` answers a fit needs; every 10 gold answers per key refits it), explicit
refits of a type the tenant has given enough gold answers for (feedback instead until it has), a few
many-option questions, requests abandoned mid-way (the client leaves after 0.2 s), and malformed ones
(bad JSON, a UTF-16 body, look-alike duplicate options, a 33-token option name).

Printed: statuses by kind of request, p50/p99 of answered decisions per time slice, resident memory
and open descriptors of this process at start, after warm-up, middle and end (sampled every 10 s),
cache sizes (prefix KV bytes, option priors, store rows), and a final check that every acknowledged
feedback is in the store, read from the file after the server has stopped. Goals, each printed
PASS/FAIL and the exit status: no 5xx but 503/504/529 (by design); resident memory within 10% after
warm-up (the first fifth of the run), not counting the engine's prefix cache, which fills up to its
bound (``--prefix-cache-mib``, 256 by default) by design and is printed beside it; nothing
acknowledged lost.

Run:

    python -m deploy.acceptance.soak                      # 20 minutes
    python -m deploy.acceptance.soak --minutes 2 --out evidence/soak/2min.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from calibration.fit import MIN_GOLD
from calibration.open import open_store
from deploy.processes import serving
from readers.embedded import prepare_embedded_model
from readers.engines import open_engine
from service.app import create_app
from service.keys import Keyring
from service.pipeline.options import quiet_loaders

TENANTS = ("t0", "t1", "t2")
BY_DESIGN_5XX = {503, 504, 529}
SAMPLE_EVERY_S = 10.0

TICKETS = ["a refund", "a new address", "the invoice", "a discount", "tracking", "a broken screen", "login"]
NOUL = {"type": "noul", "instructions": "Is the customer asking for money back?"}
CHOICE = {
    "type": "choice",
    "instructions": "Which team should handle it?",
    "criteria": {"billing": None, "shipping": "Deliveries and addresses", "support": None, "sales": None},
}
SCORE = {
    "type": "score",
    "instructions": "How urgent is it?",
    "criteria": ["not urgent", "soon", "right now"],
}
MANY = {
    "type": "choice",
    "instructions": "Which product is it about?",
    "criteria": {f"product {i}": None for i in range(40)},
}
QUESTIONS = {"noul": NOUL, "choice": CHOICE, "score": SCORE}
# The same three questions in OpenAI's shapes (POST /v1/decisions).
OPENAI_QUESTIONS = [
    {"type": "predicate", "instructions": NOUL["instructions"]},
    {
        "type": "choice",
        "instructions": CHOICE["instructions"],
        "choices": [
            {"value": name, **({"description": text} if text else {})}
            for name, text in CHOICE["criteria"].items()
        ],
    },
    {
        "type": "score",
        "instructions": SCORE["instructions"],
        "levels": [{"label": level} for level in SCORE["criteria"]],
    },
]
FEEDBACK_BURST = 4  # gold answers sent in one feedback turn, on one question type
GOLD = {"noul": lambda rng: rng.choice([True, False]), "choice": lambda rng: rng.choice(list(CHOICE["criteria"])),
        "score": lambda rng: rng.randrange(3)}  # fmt: skip

# Kind of request → weight. Decisions dominate, as in service; the rest exercise every other path.
MIX = {
    "noul": 20, "choice": 14, "score": 12, "mixed": 8, "openai": 8, "batch": 6, "many_options": 2,
    "feedback": 16, "refit": 3, "abandoned": 4, "malformed": 5,
}  # fmt: skip


def state(rng: random.Random, i: int) -> str:
    return f"Ticket {i}: the customer writes about {rng.choice(TICKETS)} for order {rng.randrange(10_000)}."


def malformed(rng: random.Random) -> tuple[bytes, dict]:
    """A body the service must refuse with a 4xx naming the field."""
    json_headers = {"content-type": "application/json"}
    kind = rng.randrange(4)
    if kind == 0:
        return b'{"state": "x", "questions": {', json_headers
    if kind == 1:
        body = {"state": "Café", "questions": {"q": NOUL}}
        return json.dumps(body, ensure_ascii=False).encode("utf-16"), json_headers
    if kind == 2:
        criteria = {"A": None, "\uff21": None}
        body = {
            "state": "x",
            "questions": {"q": {"type": "choice", "instructions": "?", "criteria": criteria}},
        }
        return json.dumps(body).encode(), json_headers
    long_name = " ".join(["word"] * 40)
    body = {"state": "x", "questions": {"q": {**CHOICE, "criteria": {long_name: None, "B": None}}}}
    return json.dumps(body).encode(), json_headers


@dataclass
class Tally:
    started: float
    statuses: collections.Counter = field(default_factory=collections.Counter)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (seconds into the run, seconds)
    acknowledged: list[tuple[int, str]] = field(default_factory=list)  # (feedback seq, decision id)
    decisions: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: collections.defaultdict(list))
    labelled: set[str] = field(default_factory=set)  # decision ids given a gold answer
    gold_answers: collections.Counter = field(default_factory=collections.Counter)  # (tenant, type) → count
    refit_after: dict[tuple[str, str], float] = field(default_factory=dict)  # (tenant, type) → monotonic time
    unexpected: list[str] = field(default_factory=list)

    def count(self, kind: str, status: int | str) -> None:
        self.statuses[(kind, status)] += 1


async def one_request(
    client: httpx.AsyncClient, tenant: str, rng: random.Random, i: int, tally: Tally
) -> None:
    kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    refittable = [
        t
        for t in ("noul", "choice")
        if tally.gold_answers[tenant, t] >= MIN_GOLD
        and time.monotonic() >= tally.refit_after.get((tenant, t), 0)
    ]
    if kind == "refit" and not refittable:
        kind = "feedback"  # too few gold answers for any fit yet, or told to wait: send answers instead
    if kind == "feedback" and not tally.decisions[tenant]:
        kind = "noul"
    started = time.monotonic()
    try:
        if kind in QUESTIONS or kind in ("mixed", "many_options"):
            questions = (
                {"q": QUESTIONS[kind]}
                if kind in QUESTIONS
                else {"route": CHOICE, "refund": NOUL, "urgency": SCORE}
                if kind == "mixed"
                else {"product": MANY}
            )
            response = await client.post(
                "/v1/systemone", json={"state": state(rng, i), "questions": questions}
            )
            if response.status_code == 200:
                tally.latencies.append((started - tally.started, time.monotonic() - started))
                for name, answer in response.json()["answers"].items():
                    if name in ("q", "route", "refund", "urgency"):
                        tally.decisions[tenant].append((answer["x_reading"]["decision_id"], answer["type"]))
        elif kind == "openai":
            response = await client.post(
                "/v1/decisions",
                json={"model": "gpt-6-luna", "input": state(rng, i), "questions": OPENAI_QUESTIONS},
            )
            if response.status_code == 200:
                tally.latencies.append((started - tally.started, time.monotonic() - started))
                if len(response.json()["answers"]) != len(OPENAI_QUESTIONS):
                    tally.unexpected.append("/v1/decisions answered a question count not asked")
        elif kind == "batch":
            states = [state(rng, i * 100 + k) for k in range(rng.randrange(4, 9))]
            response = await client.post("/decide/batch", json={"states": states, "questions": {"q": NOUL}})
        elif kind == "feedback":
            # A few unlabelled decisions of one type (the one with the most): spread one at a time over
            # three types, no key reached the gold answers a fit needs in a short run.
            unlabelled = [(d, t) for d, t in tally.decisions[tenant] if d not in tally.labelled]
            by_type = collections.Counter(t for _, t in unlabelled)
            if not by_type:
                unlabelled, by_type = (
                    tally.decisions[tenant],
                    collections.Counter([tally.decisions[tenant][-1][1]]),
                )
            question_type = by_type.most_common(1)[0][0]
            chosen = [d for d, t in unlabelled if t == question_type][-FEEDBACK_BURST:]
            for decision_id in chosen:
                response = await client.post(
                    "/v1/feedback", json={"decision_id": decision_id, "gold": GOLD[question_type](rng)}
                )
                if response.status_code != 200:
                    break
                answer = response.json()
                tally.acknowledged.append((answer["recorded"], decision_id))
                tally.labelled.add(decision_id)
                gold = tally.gold_answers
                gold[tenant, question_type] = max(gold[tenant, question_type], answer["gold_answers"])
                if decision_id != chosen[-1]:
                    tally.count(kind, response.status_code)
        elif kind == "refit":
            question_type = rng.choice(refittable)
            count = {"noul": 2, "choice": 4}[question_type]
            response = await client.post(
                "/v1/calibrations/refit", json={"question_type": question_type, "option_count": count}
            )
            if response.status_code == 429:
                # Refits are limited per key (service/refit_limits.py), and feedback refits the key too:
                # a polite client waits as told. A 429 without Retry-After is a fault.
                retry_after = response.headers.get("retry-after")
                if retry_after is None:
                    tally.unexpected.append("refit 429 without Retry-After")
                else:
                    tally.refit_after[tenant, question_type] = time.monotonic() + float(retry_after)
        elif kind == "abandoned":
            states = [state(rng, i * 100 + k) for k in range(16)]
            try:
                response = await asyncio.wait_for(
                    client.post("/decide/batch", json={"states": states, "questions": {"q": CHOICE}}), 0.2
                )
            except TimeoutError:
                tally.count(kind, "left")
                return
        else:
            content, headers = malformed(rng)
            response = await client.post("/v1/systemone", content=content, headers=headers)
            if not 400 <= response.status_code < 500:
                tally.unexpected.append(f"malformed body answered {response.status_code}")
    except httpx.HTTPError as error:
        tally.count(kind, type(error).__name__)
        return
    tally.count(kind, response.status_code)
    if response.status_code >= 500 and response.status_code not in BY_DESIGN_5XX:
        tally.unexpected.append(f"{kind}: {response.status_code} {response.text[:200]}")


async def tenant_loop(url: str, key: str, tenant: str, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        i = 0
        while time.monotonic() < until:
            await one_request(client, tenant, rng, seed * 1_000_000 + i, tally)
            i += 1


def resources() -> dict:
    rss_kib = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return {"rss_mib": round(rss_kib / 1024, 1), "open_fds": len(os.listdir("/proc/self/fd"))}


def caches(app) -> dict:
    engine = app.state.reader.engine
    return {
        "prefix_cache_mib": round(engine.prefix_cache.bytes / 2**20, 1),
        "option_priors": len(app.state.priors) if app.state.priors is not None else 0,
        "admission_in_flight": app.state.admission.in_flight,
        "admission_queued": app.state.admission.queued,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lost_feedback(store_path: Path, acknowledged: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Acknowledged feedback not in the store file, read afresh after the server stopped."""
    with contextlib.closing(sqlite3.connect(f"file:{store_path}?mode=ro", uri=True)) as db:
        stored = set(db.execute("SELECT seq, decision_id FROM feedback"))
    return [entry for entry in acknowledged if tuple(entry) not in stored]


def store_rows(store_path: Path) -> dict:
    """Rows per table, and per tenant: each tenant's records are its own."""
    with contextlib.closing(sqlite3.connect(f"file:{store_path}?mode=ro", uri=True)) as db:
        rows: dict = {}
        for table in ("decisions", "feedback", "calibrations"):
            rows[table] = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            rows[f"{table}_by_tenant"] = dict(
                db.execute(f"SELECT tenant, count(*) FROM {table} GROUP BY tenant ORDER BY tenant").fetchall()
            )
        return rows


async def soak(args: argparse.Namespace) -> dict:
    quiet_loaders()
    model_dir = prepare_embedded_model()
    keys = {tenant: f"soak-key-{tenant}-{random.Random(args.seed).getrandbits(64):x}" for tenant in TENANTS}
    folder = Path(args.store_dir or tempfile.mkdtemp(prefix="opendecide-soak-"))
    store_path = folder / "soak.sqlite3"

    async def opener():
        return await open_engine("local", model_dir=model_dir)

    key_file = folder / "keys"
    key_file.write_text(
        "".join(f"{keys[tenant]} tenant={tenant} scopes=decide,calibrate\n" for tenant in TENANTS)
    )
    store = open_store(store_path)
    app = create_app(open_engine=opener, store=store, api_keys=Keyring(key_file, {}), auto_refit_every=10)
    duration_s = args.minutes * 60
    warm_up_s = duration_s / 5
    samples: list[dict] = []
    try:
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=300) as probe:
                while (await probe.get("/readyz")).status_code != 200:
                    await asyncio.sleep(0.5)
            tally = Tally(started=time.monotonic())
            until = tally.started + duration_s

            async def sample() -> None:
                while True:
                    samples.append(
                        {"t_s": round(time.monotonic() - tally.started, 1), **resources(), **caches(app)}
                    )
                    await asyncio.sleep(SAMPLE_EVERY_S)

            sampler = asyncio.create_task(sample())
            loops = [
                tenant_loop(url, keys[tenant], tenant, args.seed * 100 + n * 10 + c, until, tally)
                for n, tenant in enumerate(TENANTS)
                for c in range(args.clients)
            ]
            await asyncio.gather(*loops)
            sampler.cancel()
            samples.append({"t_s": round(time.monotonic() - tally.started, 1), **resources(), **caches(app)})
    finally:
        store.close()
    return report(args, tally, samples, warm_up_s, store_path)


def report(args, tally: Tally, samples: list[dict], warm_up_s: float, store_path: Path) -> dict:
    duration_s = args.minutes * 60
    slices = []
    slice_s = duration_s / args.slices
    for k in range(args.slices):
        within = [s for t, s in tally.latencies if k * slice_s <= t < (k + 1) * slice_s]
        slices.append(
            {
                "from_s": round(k * slice_s),
                "answered": len(within),
                "p50_ms": round(1000 * percentile(within, 0.5)) if within else None,
                "p99_ms": round(1000 * percentile(within, 0.99)) if within else None,
            }
        )
    after_warm_up = [s for s in samples if s["t_s"] >= warm_up_s] or samples[-1:]
    baseline = after_warm_up[0]
    peak_rss = max(s["rss_mib"] for s in after_warm_up)

    def beside_cache(sample: dict) -> float:  # the prefix cache is bounded by design: drift is the rest
        return sample["rss_mib"] - sample["prefix_cache_mib"]

    peak_beside_cache = max(beside_cache(s) for s in after_warm_up)
    middle = min(samples, key=lambda s: abs(s["t_s"] - duration_s / 2))
    lost = lost_feedback(store_path, tally.acknowledged)
    by_status = collections.Counter()
    for (_, status), n in tally.statuses.items():
        by_status[str(status)] += n
    goals = {
        "no_5xx_but_503_504_529": not tally.unexpected,
        "memory_within_10pct_after_warm_up": peak_beside_cache <= 1.10 * beside_cache(baseline),
        "nothing_acknowledged_lost": not lost,
    }
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "minutes": args.minutes,
        "tenants": len(TENANTS),
        "clients_per_tenant": args.clients,
        "seed": args.seed,
        "warm_up_s": round(warm_up_s),
        "requests": sum(tally.statuses.values()),
        "statuses": dict(sorted(by_status.items())),
        "statuses_by_kind": {
            f"{kind} {status}": n for (kind, status), n in sorted(tally.statuses.items(), key=str)
        },
        "latency_slices": slices,
        "resources": {
            "start": samples[0],
            "after_warm_up": baseline,
            "middle": middle,
            "end": samples[-1],
            "peak_rss_mib_after_warm_up": peak_rss,
            "rss_beside_prefix_cache_mib": {
                "after_warm_up": round(beside_cache(baseline), 1),
                "peak_after_warm_up": round(peak_beside_cache, 1),
            },
        },
        "store_rows": store_rows(store_path),
        "feedback_acknowledged": len(tally.acknowledged),
        "feedback_lost": len(lost),
        "unexpected": tally.unexpected[:20],
        "goals": goals,
    }


def print_report(result: dict) -> None:
    print(f"soak {result['minutes']} min, {result['tenants']} tenants × {result['clients_per_tenant']} clients, "
          f"{result['requests']} requests, seed {result['seed']}")  # fmt: skip
    print("statuses:", json.dumps(result["statuses"]))
    for line, n in result["statuses_by_kind"].items():
        print(f"  {line}: {n}")
    print("answered decisions by time slice (p50 / p99 ms):")
    for s in result["latency_slices"]:
        print(f"  from {s['from_s']:>5} s: {s['answered']:>5} answered, p50 {s['p50_ms']}, p99 {s['p99_ms']}")
    for moment in ("start", "after_warm_up", "middle", "end"):
        print(f"{moment:>14}: {json.dumps(result['resources'][moment])}")
    beside = result["resources"]["rss_beside_prefix_cache_mib"]
    print(f"peak RSS after warm-up: {result['resources']['peak_rss_mib_after_warm_up']} MiB; "
          f"beside the prefix cache: {beside['after_warm_up']} → peak {beside['peak_after_warm_up']} MiB")  # fmt: skip
    print("store rows:", json.dumps(result["store_rows"]))
    print(
        f"feedback acknowledged {result['feedback_acknowledged']}, missing from the store {result['feedback_lost']}"
    )
    for problem in result["unexpected"]:
        print("UNEXPECTED:", problem)
    for goal, met in result["goals"].items():
        print(f"{'PASS' if met else 'FAIL'} {goal}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=2, help="concurrent request loops per tenant")
    parser.add_argument("--slices", type=int, default=10, help="time slices for p50/p99")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--store-dir", type=Path, help="folder for the SQLite store (default: a new temp folder)"
    )
    parser.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = parser.parse_args(argv)
    result = asyncio.run(soak(args))
    print_report(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
