"""The embedded engine in bfloat16 against float32 on the shipped tasks: how far its label probabilities
move, how many answers change, and how long the reads take.

Each dtype is its own ``LocalEngine`` (``dtype=``), one after the other, reading the same test records
(``--limit`` per task, spread over the sample) through the current layout's reader, raw reads (no prior,
no calibration), ``--concurrency`` at a time. Printed per task: the largest and the median absolute
difference of any option's probability, the answers (most probable option) that differ, and each
dtype's wall time. No bound is asserted here; the report states one against the figures.

Run:

    .venv/bin/python -m bench.precision_reads --limit 30 --out evidence/latency/precision-reads/reads.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from eval.decisions.tasks import TASKS, spread
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from readers.reader import Reader
from service.protocol import SystemOneRequest


async def read_all(dtype: str, limit: int, concurrency: int) -> tuple[dict[str, list[list[float]]], float]:
    engine = LocalEngine(prepare_embedded_model(), dtype=dtype)
    reader = Reader(engine)
    gate = asyncio.Semaphore(concurrency)
    out: dict[str, list[list[float]]] = {}
    started = time.perf_counter()
    try:
        for name, task in TASKS.items():
            records = spread(task.records("test"), limit)
            spec = SystemOneRequest.model_validate({"state": "", "questions": {"q": task.question()}})
            question = spec.questions["q"].to_spec()

            async def one(record, question=question):
                async with gate:
                    reading = await reader.read(question, record.text)
                return list(reading.label_probabilities.probabilities)

            out[name] = list(await asyncio.gather(*(one(r) for r in records)))
    finally:
        await engine.aclose()
    return out, time.perf_counter() - started


async def main(args: argparse.Namespace) -> dict:
    reads, wall = {}, {}
    for dtype in ("float32", "bfloat16"):
        reads[dtype], wall[dtype] = await read_all(dtype, args.limit, args.concurrency)
    tasks = {}
    for name in TASKS:
        a, b = np.asarray(reads["float32"][name]), np.asarray(reads["bfloat16"][name])
        gap = np.abs(a - b)
        tasks[name] = {
            "records": len(a),
            "max_abs_diff": float(gap.max()),
            "median_max_abs_diff": float(np.median(gap.max(axis=1))),
            "answers_differ": int(np.sum(a.argmax(axis=1) != b.argmax(axis=1))),
        }
    return {"args": vars(args) | {"out": str(args.out)}, "wall_s": wall, "tasks": tasks}


def report(result: dict) -> str:
    lines = [
        f"wall s: float32 {result['wall_s']['float32']:.1f}, bfloat16 {result['wall_s']['bfloat16']:.1f}",
        "",
        "| task | records | max abs diff | median per-record max | answers that differ |",
        "|---|---|---|---|---|",
    ]
    for name, t in result["tasks"].items():
        lines.append(
            f"| {name} | {t['records']} | {t['max_abs_diff']:.4f} | {t['median_max_abs_diff']:.4f} | {t['answers_differ']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()
    outcome = asyncio.run(main(arguments))
    print(report(outcome))
    if arguments.out:
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
        arguments.out.write_text(json.dumps(outcome, indent=1) + "\n")
        arguments.out.with_suffix(".md").write_text(report(outcome) + "\n")
