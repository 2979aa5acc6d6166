"""One state, many questions: latency and decisions/s through the service, shared path vs per-question path.

Each variant is the service in its own process over HTTP (this script re-runs itself as the
service with ``--serve-child``, so the engine option ``share_prefix`` can be set), measured in turn
in one run so the ratios are side by side:

- latency at concurrency 1 of one request carrying N = 1, 2, 4, 8, 16 yes/no questions about one
  ~180-token state (a fresh state per request: no prefix cache help across requests), and N=8 ÷ N=1;
- decisions/s for 10-question requests at concurrency 1 and 4, shared path ÷ per-question path;
- decisions/s for one-question requests at concurrency 8 (embedded ÷ vLLM-CPU);
- ``/decide/batch`` (16 states × one question) decisions/s;
- peak RSS of the service process (``VmHWM``), and on vLLM the prefix-cache hit rate
  (``vllm:prefix_cache_hits_total`` ÷ ``vllm:prefix_cache_queries_total``) per request shape.

``--before-tree DIR`` adds the service of another checkout (``python -m opendecide serve`` run
there, e.g. ``git archive`` of main) as the "before" variants.

Run (vLLM-CPU from ``decide engine start --port 8237``, KV blocks of 32 tokens by default; the
local engine always runs). On vLLM a third variant reads each request's first question alone and
then the rest (``prefill_first``), to compare the two orders' prefix-cache hits per request shape.

    .venv/bin/python -m bench.multi_question --engine-url http://127.0.0.1:8237 \
        --before-tree /tmp/shared-before --out docs/evidence/multi-question/multi-question.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from bench import ROOT
from bench.tickets import QUESTIONS
from deploy.processes import free_port, wait_for_models
from eval.capacity.load import machine_info, run_bench, run_load, vllm_prefix_counters

# A support ticket of about 180 tokens (SmolLM2 tokenizer); "{ticket}" makes every request's state fresh.
STATE = (
    "Ticket {ticket}. Customer: Maria Lopez, premium plan since 2021, billed monthly. Message: Hi, I was charged "
    "twice for my March invoice, once on the 3rd and again on the 5th, both for $49.99. I already contacted your "
    "chat support last week and the agent promised a refund within three business days, but nothing has arrived "
    "and my bank statement still shows both charges. I also cannot log in to the mobile app since the last update; "
    "it shows a blank screen after the splash logo on my Android phone. Honestly this is very frustrating, I have "
    "recommended you to friends and now I am thinking of cancelling. Please fix the billing today and tell me "
    "when the app will work again. If I do not hear back by Friday I will dispute the charge with my bank."
)
SIZES = (1, 2, 4, 8, 16)


def body(ticket: int, n: int) -> dict:
    questions = {f"q{i}": {"type": "noul", "instructions": QUESTIONS[i]} for i in range(n)}
    return {"state": STATE.format(ticket=ticket), "questions": questions}


def serve_child(args: argparse.Namespace) -> None:
    """The service around an engine opened with ``share_prefix`` as asked (no calibration store, no
    prior correction: the bench measures the read path, and a prior's three reads per new question,
    on empty states, would add reads to the first requests and hits to the engine's prefix cache)."""
    import uvicorn

    from readers.engines import open_engine
    from service.app import create_app

    async def opener():
        return await open_engine(
            args.kind,
            url=args.engine_url,
            share_prefix=args.share_prefix,
            prefill_first=args.prefill_first,
            timeout_s=120,
        )

    uvicorn.run(
        create_app(open_engine=opener, prior_correction="off"),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
    )


def start(variant: dict, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if variant["tree"]:
        store = (
            Path(tempfile.mkdtemp(prefix="multi-question-")) / "calibration.sqlite3"
        )  # not the user's store
        command = [
            sys.executable,
            "-m",
            "opendecide",
            "serve",
            "--engine",
            variant["kind"],
            "--port",
            str(port),
            "--store",
            str(store),
        ]
        if variant["kind"] == "vllm":
            command += ["--engine-url", args.engine_url, "--engine-timeout", "120"]
        cwd, env = variant["tree"], {**os.environ, "PYTHONPATH": variant["tree"]}
    else:
        command = [
            sys.executable,
            "-m",
            "bench.multi_question",
            "--serve-child",
            "--kind",
            variant["kind"],
            "--port",
            str(port),
        ]
        command += [
            "--engine-url",
            args.engine_url or "",
            "--share-prefix" if variant["share_prefix"] else "--per-question",
        ]
        command += ["--prefill-first"] if variant.get("prefill_first") else []
        cwd, env = ROOT, os.environ
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_models(url, process=process, timeout_s=300)
    except BaseException:
        process.terminate()
        raise
    return process, url


def peak_rss_mib(pid: int) -> float | None:
    status = Path(f"/proc/{pid}/status")
    for line in status.read_text().splitlines() if status.is_file() else []:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


async def prefix_counters(client: httpx.AsyncClient | None) -> tuple[float, float]:
    if client is None:
        return 0.0, 0.0
    return await vllm_prefix_counters(client)


class Tickets:
    """Fresh ticket numbers, so no request's state was seen before."""

    def __init__(self, seed: int) -> None:
        self.next = 10_000 + 1_000_000 * seed

    def __call__(self) -> int:
        self.next += 1
        return self.next


async def measure(variant: dict, args: argparse.Namespace, tickets: Tickets) -> dict:
    process, url = start(variant, args)
    out: dict = {
        "variant": variant["name"],
        "kind": variant["kind"],
        "share_prefix": variant["share_prefix"],
        "tree": variant["tree"],
    }
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    engine = httpx.AsyncClient(base_url=args.engine_url, timeout=30) if variant["kind"] == "vllm" else None
    try:
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

            async def post(path: str, payload: dict) -> bool:
                return (await client.post(path, json=payload)).status_code == 200

            async def shape(name: str, run):
                hits0, queries0 = await prefix_counters(engine)
                result = await run()
                hits1, queries1 = await prefix_counters(engine)
                if engine is not None:
                    out.setdefault("prefix_cache", {})[name] = {
                        "hits": hits1 - hits0,
                        "queries": queries1 - queries0,
                        "hit_rate": (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else None,
                    }
                return result

            for _ in range(2):  # warm the service, the engine and the tokenizer caches
                assert await post("/decide", body(tickets(), 4))

            latency = {}
            for n in args.sizes if variant["sweep"] else ():

                async def sweep(n=n):
                    samples, failed = [], 0
                    for _ in range(args.passes):
                        started = time.monotonic()
                        ok = await post("/decide", body(tickets(), n))
                        samples.append((time.monotonic() - started) * 1000)
                        failed += not ok
                    return {
                        "median_ms": statistics.median(samples),
                        "min_ms": min(samples),
                        "max_ms": max(samples),
                        "failed": failed,
                        "samples_ms": samples,
                    }

                latency[n] = await shape(f"latency_n{n}", sweep)
            out["latency"] = latency
            if 1 in latency and 8 in latency:
                out["n8_over_n1"] = latency[8]["median_ms"] / latency[1]["median_ms"]

            throughput = {}
            for concurrency in args.ten_concurrency:
                count = args.ten_requests * concurrency

                async def ten(concurrency=concurrency, count=count):
                    states = [tickets() for _ in range(count)]
                    return await run_load(
                        lambda i: post("/decide", body(states[i], 10)),
                        requests=count,
                        concurrency=concurrency,
                    )

                result = await shape(f"ten_questions_c{concurrency}", ten)
                throughput[concurrency] = {**result.as_json(), "decisions_per_s": result.decisions_per_s * 10}
            out["ten_questions"] = throughput

            if variant["sweep"]:

                async def single():
                    states = [tickets() for _ in range(args.single_requests)]
                    return await run_load(
                        lambda i: post("/decide", body(states[i], 1)),
                        requests=args.single_requests,
                        concurrency=8,
                    )

                out["one_question_c8"] = (await shape("one_question_c8", single)).as_json()

                async def batch():
                    payloads = [
                        {
                            "states": [STATE.format(ticket=tickets()) for _ in range(16)],
                            "questions": {"q0": {"type": "noul", "instructions": QUESTIONS[0]}},
                        }
                        for _ in range(args.batch_requests)
                    ]
                    return await run_load(
                        lambda i: post("/decide/batch", payloads[i]),
                        requests=args.batch_requests,
                        concurrency=1,
                    )

                result = await shape("batch_16_states", batch)
                out["batch_16_states"] = {**result.as_json(), "decisions_per_s": result.decisions_per_s * 16}
    finally:
        out["peak_rss_mib"] = peak_rss_mib(process.pid)
        process.terminate()
        process.wait(timeout=60)
        if engine is not None:
            await engine.aclose()
    return out


async def main(args: argparse.Namespace) -> dict:
    random.seed(args.seed)
    np.random.seed(args.seed)
    kinds = ["local"] + (["vllm"] if args.engine_url else [])
    variants = []
    for kind in kinds:
        name = "embedded" if kind == "local" else "vllm-cpu"
        variants.append(
            {"name": f"{name}-shared", "kind": kind, "share_prefix": True, "tree": None, "sweep": True}
        )
        variants.append(
            {
                "name": f"{name}-per-question",
                "kind": kind,
                "share_prefix": False,
                "tree": None,
                "sweep": False,
            }
        )
        if kind == "vllm":  # the other order: the first question alone, then the rest (VLLMEngine.read_many)
            variants.append(
                {
                    "name": f"{name}-prefill-first",
                    "kind": kind,
                    "share_prefix": True,
                    "prefill_first": True,
                    "tree": None,
                    "sweep": True,
                }
            )
        if args.before_tree:
            variants.append(
                {
                    "name": f"{name}-before",
                    "kind": kind,
                    "share_prefix": None,
                    "tree": str(args.before_tree),
                    "sweep": True,
                }
            )
    tickets = Tickets(args.seed)
    results = {}
    for variant in variants:
        print(f"measuring {variant['name']} …", file=sys.stderr, flush=True)
        results[variant["name"]] = await measure(variant, args, tickets)
        print(
            json.dumps(results[variant["name"]]), file=sys.stderr, flush=True
        )  # kept if a later variant fails
    summary = {}
    for name in ("embedded", "vllm-cpu"):
        shared, per_question = results.get(f"{name}-shared"), results.get(f"{name}-per-question")
        if shared and per_question:
            summary[name] = {
                "n8_over_n1": shared.get("n8_over_n1"),
                **{
                    f"ten_questions_c{c}_shared_over_per_question": shared["ten_questions"][c][
                        "decisions_per_s"
                    ]
                    / per_question["ten_questions"][c]["decisions_per_s"]
                    for c in args.ten_concurrency
                },
            }
    if "embedded-shared" in results and "vllm-cpu-shared" in results:
        summary["one_question_c8_embedded_over_vllm"] = (
            results["embedded-shared"]["one_question_c8"]["decisions_per_s"]
            / results["vllm-cpu-shared"]["one_question_c8"]["decisions_per_s"]
        )
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "bench": "multi_question",
        "machine": machine_info(),
        "engine_url": args.engine_url,
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "summary": summary,
        "variants": results,
    }


def report(result: dict) -> str:
    variants = result["variants"]
    sizes = result["args"]["sizes"]
    lines = [
        f"machine: {result['machine']['cpu']} ({result['machine']['cores']} cores); passes per size: {result['args']['passes']}",
        "",
    ]
    lines += [
        "Latency of one request, N questions on one fresh ~180-token state, concurrency 1: median ms (min–max)",
        "",
    ]
    lines += [
        "| variant | " + " | ".join(f"N={n}" for n in sizes) + " | N=8 ÷ N=1 |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for name, row in variants.items():
        if row["latency"]:
            cells = [
                f"{row['latency'][n]['median_ms']:.0f} ({row['latency'][n]['min_ms']:.0f}–{row['latency'][n]['max_ms']:.0f})"
                for n in sizes
            ]
            ratio = row.get("n8_over_n1")
            lines.append(
                f"| {name} | " + " | ".join(cells) + f" | {'—' if ratio is None else f'{ratio:.2f}'} |"
            )
    concurrencies = result["args"]["ten_concurrency"]
    lines += ["", "Decisions/s, 10-question requests (failed requests in brackets)", ""]
    lines += [
        "| variant | " + " | ".join(f"c={c}" for c in concurrencies) + " | peak RSS MiB |",
        "|---|" + "---|" * (len(concurrencies) + 1),
    ]
    for name, row in variants.items():
        cells = [
            f"{row['ten_questions'][c]['decisions_per_s']:.2f} [{row['ten_questions'][c]['failed']}]"
            for c in concurrencies
        ]
        rss = row.get("peak_rss_mib")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'—' if rss is None else f'{rss:.0f}'} |")
    lines += [
        "",
        "| variant | one-question decisions/s at c=8 | /decide/batch 16 states × 1 question, decisions/s |",
        "|---|---|---|",
    ]
    for name, row in variants.items():
        if "one_question_c8" in row:
            lines.append(
                f"| {name} | {row['one_question_c8']['decisions_per_s']:.2f} [{row['one_question_c8']['failed']}] | {row['batch_16_states']['decisions_per_s']:.2f} [{row['batch_16_states']['failed']}] |"
            )
    cache_rows = [
        (name, shape, figures)
        for name, row in variants.items()
        for shape, figures in row.get("prefix_cache", {}).items()
    ]
    if cache_rows:
        lines += [
            "",
            "vLLM prefix cache per request shape",
            "",
            "| variant | shape | hits | queries | hit rate |",
            "|---|---|---|---|---|",
        ]
        for name, shape, figures in cache_rows:
            rate = figures["hit_rate"]
            lines.append(
                f"| {name} | {shape} | {figures['hits']:.0f} | {figures['queries']:.0f} | {'—' if rate is None else f'{rate:.1%}'} |"
            )
    lines += [
        "",
        "Summary (targets: N=8 ÷ N=1 ≤ 2.0; shared ÷ per-question ≥ 3; embedded ÷ vLLM-CPU at c=8 ≥ 1.0)",
        "",
    ]
    for key, value in result["summary"].items():
        if isinstance(value, dict):
            lines += [
                f"- {key}: " + ", ".join(f"{k} {'—' if v is None else f'{v:.2f}'}" for k, v in value.items())
            ]
        else:
            lines += [f"- {key}: {value:.2f}"]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine-url", default=None, help="a vLLM server; without it only the local engine is measured"
    )
    parser.add_argument(
        "--before-tree", type=Path, default=None, help="another checkout's service, measured as 'before'"
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="questions per request in the latency sweep"
    )
    parser.add_argument("--passes", type=int, default=5, help="requests per size in the latency sweep")
    parser.add_argument("--ten-concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--ten-requests", type=int, default=3, help="10-question requests per unit of concurrency"
    )
    parser.add_argument(
        "--single-requests", type=int, default=48, help="one-question requests at concurrency 8"
    )
    parser.add_argument("--batch-requests", type=int, default=3, help="/decide/batch requests of 16 states")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="local", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--share-prefix", dest="share_prefix", action="store_true", default=True, help=argparse.SUPPRESS
    )
    parser.add_argument("--per-question", dest="share_prefix", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--prefill-first", action="store_true", help=argparse.SUPPRESS)
    if "--serve-child" in sys.argv:
        child = parser.parse_args()
        child.engine_url = child.engine_url or None
        serve_child(child)
    else:
        run_bench(parser, main, report)
