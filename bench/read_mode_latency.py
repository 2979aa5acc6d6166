"""Latency of each read mode on one vLLM engine: exact, masked (structured-output choice), top-k.

The same prompts through ``VLLMEngine.read`` in each mode, one at a time (concurrency 1) and at
concurrency 8, modes interleaved pass by pass so drift hits them alike. Prints p50/p90 per mode and
each mode's p50 ÷ exact's.

Run (the engine from ``make engine``):

    make engine
    .venv/bin/python -m bench.read_mode_latency --engine-url http://127.0.0.1:8100 \
        --out evidence/bench/read-mode-latency-vllm-cpu.json

The JSON opens with the run manifest of ``eval/evidence/manifest.py`` (engines, git commit, args).
"""

from __future__ import annotations

import argparse
import random
from contextlib import AsyncExitStack
from pathlib import Path

import numpy as np

from eval.capacity.load import bench_args, machine_info, run_bench, run_load
from eval.decisions.tasks import TASKS, load_sample, spread
from eval.evidence.manifest import run_manifest
from readers.engines import open_engine_spec
from readers.engines.base import ReadMode, ReadRequest
from readers.reader import Reader
from service.protocol import ChoiceQuestion


async def main(args: argparse.Namespace) -> dict:
    random.seed(args.seed)
    async with AsyncExitStack() as stack:
        engines = {
            read_mode: await stack.enter_async_context(
                await open_engine_spec(f"vllm:{read_mode.value}", engine_url=args.engine_url)
            )
            for read_mode in ReadMode
        }
        manifest = run_manifest(
            "bench:read_mode_latency",
            engines={read_mode.value: engine for read_mode, engine in engines.items()},
            args=bench_args(args),
        )
        task = TASKS[args.task]
        spec = ChoiceQuestion.model_validate(task.question()).to_spec()
        reader = Reader(engines[ReadMode.EXACT])
        requests = []
        for record in spread(load_sample(args.task), args.records):
            slot, _ = reader.prepare(spec, record.text)
            requests.append(ReadRequest(slot.prompt_ids, slot.label_ids, slot.labels))

        results: dict[str, dict[int, list[dict]]] = {
            read_mode.value: {c: [] for c in args.concurrency} for read_mode in ReadMode
        }
        for _ in range(args.passes):
            for concurrency in args.concurrency:
                for read_mode, engine in engines.items():

                    async def send(i: int, engine=engine) -> bool:
                        await engine.read(requests[i % len(requests)])
                        return True

                    outcome = await run_load(send, requests=len(requests), concurrency=concurrency)
                    results[read_mode.value][concurrency].append(outcome.as_json())

    summary = []
    for concurrency in args.concurrency:
        exact_p50 = np.median([r["p50_ms"] for r in results["exact"][concurrency]])
        for read_mode in ReadMode:
            runs = results[read_mode.value][concurrency]
            p50 = float(np.median([r["p50_ms"] for r in runs]))
            summary.append(
                {
                    "read_mode": read_mode.value,
                    "concurrency": concurrency,
                    "p50_ms": p50,
                    "p90_ms": float(np.median([r["p90_ms"] for r in runs])),
                    "decisions_per_s": float(np.median([r["decisions_per_s"] for r in runs])),
                    "failed": int(sum(r["failed"] for r in runs)),
                    "p50_over_exact": p50 / exact_p50,
                }
            )
    return {
        "manifest": manifest,
        "machine": machine_info(),
        "summary": summary,
        "runs": results,
    }


def report(result: dict) -> str:
    lines = [
        f"machine: {result['machine']['cpu']} ({result['machine']['cores']} cores), task {result['manifest']['args']['task']}",
        "",
    ]
    lines += [
        "| read mode | concurrency | p50 ms | p90 ms | decisions/s | p50 ÷ exact |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        lines.append(
            f"| {row['read_mode']} | {row['concurrency']} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} | {row['decisions_per_s']:.2f} | {row['p50_over_exact']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-url", default="http://127.0.0.1:8100")
    parser.add_argument(
        "--task",
        default="ag_news",
        choices=[name for name, task in TASKS.items() if task.question_type == "choice"],
    )
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    run_bench(parser, main, report)
