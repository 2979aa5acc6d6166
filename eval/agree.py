"""Agreement between two engines or read modes over the same records (``decide eval agree``).

The local analogue of "the same checkpoint on TPU and L4": per task, how many records get the same
predicted label, the largest and median absolute probability difference, and every record whose
label differs, with both margins and whether either read missed labels.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.reads import RecordRead


def margin(probabilities: dict[str, float]) -> float:
    """Top probability minus the runner-up: how close a read was to a tie."""
    top = sorted(probabilities.values(), reverse=True)
    return top[0] - top[1]


@dataclass(frozen=True)
class Agreement:
    task: str
    n: int
    same_label: int
    max_abs_dp: float
    median_abs_dp: float
    differing: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.same_label / self.n if self.n else float("nan")

    @property
    def differing_with_missing_labels(self) -> int:
        return sum(1 for case in self.differing if case["a_missing_labels"] or case["b_missing_labels"])


def agreement(task: str, a: Sequence[RecordRead], b: Sequence[RecordRead]) -> Agreement:
    """Compare two reads of the same records (matched by id and variant)."""
    b_by_key = {(read.id, read.variant): read for read in b}
    if len(b_by_key) != len(a) or any((read.id, read.variant) not in b_by_key for read in a):
        raise ValueError("the two runs did not read the same records")
    deltas, differing, same = [], [], 0
    for read_a in a:
        read_b = b_by_key[(read_a.id, read_a.variant)]
        deltas.append(max(abs(read_a.probabilities[o] - read_b.probabilities[o]) for o in read_a.probabilities))
        if read_a.predicted == read_b.predicted:
            same += 1
            continue
        differing.append(
            {
                "id": read_a.id,
                "variant": read_a.variant,
                "a_label": read_a.predicted,
                "b_label": read_b.predicted,
                "a_margin": margin(read_a.probabilities),
                "b_margin": margin(read_b.probabilities),
                "a_missing_labels": read_a.reading["labels_total"] - read_a.reading["labels_returned"],
                "b_missing_labels": read_b.reading["labels_total"] - read_b.reading["labels_returned"],
            }
        )
    return Agreement(task, len(a), same, max(deltas, default=0.0), statistics.median(deltas) if deltas else 0.0, differing)


def agreement_table(rows: Sequence[Agreement], a_name: str, b_name: str) -> str:
    """Markdown: one row per task, then every differing case."""
    lines = [
        f"| task | n | same label ({a_name} vs {b_name}) | max abs dp | median abs dp | differing with missing labels |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.task} | {row.n} | {row.same_label} of {row.n} | {row.max_abs_dp:.2e} | {row.median_abs_dp:.2e} | "
            f"{row.differing_with_missing_labels} of {len(row.differing)} |"
        )
    cases = [case for row in rows for case in row.differing]
    if cases:
        lines += ["", "| id | variant | a label (margin) | b label (margin) | missing labels a / b |", "|---|---|---|---|---|"]
        for case in cases:
            lines.append(
                f"| {case['id']} | {case['variant']} | {case['a_label']} ({case['a_margin']:.3f}) | "
                f"{case['b_label']} ({case['b_margin']:.3f}) | {case['a_missing_labels']} / {case['b_missing_labels']} |"
            )
    return "\n".join(lines) + "\n"


async def run_agreement(
    a_spec: str,
    b_spec: str,
    *,
    tasks: Sequence[str],
    limit: int | None = None,
    reversed_variants: bool = True,
    engine_url: str | None = None,
    top_k: int | None = None,
    concurrency: int = 4,
    timeout_s: float = 120.0,
    out: Path | None = None,
) -> list[Agreement]:
    """Read the same records through engines ``a_spec`` and ``b_spec``; write evidence to ``out``."""
    from eval.manifest import run_manifest, write_json
    from eval.reads import read_records
    from eval.tasks import TASKS, load_sample, spread
    from readers.engines import open_engine_spec
    from readers.reader import Reader

    engines = {}
    try:
        for name, spec in (("a", a_spec), ("b", b_spec)):
            engines[name] = await open_engine_spec(spec, top_k=top_k, engine_url=engine_url, timeout_s=timeout_s)
        readers = {name: Reader(engine) for name, engine in engines.items()}
        rows, evidence = [], {"a": [], "b": []}
        for task_name in tasks:
            task = TASKS[task_name]
            records = spread(load_sample(task_name), limit)
            variants = task.variants if reversed_variants else ("original",)
            reads = {"a": [], "b": []}
            for variant in variants:
                for name, reader in readers.items():
                    reads[name] += await read_records(reader, task, records, variant=variant, concurrency=concurrency)
            rows.append(agreement(task_name, reads["a"], reads["b"]))
            for name in reads:
                evidence[name] += reads[name]
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for name, reads_of in evidence.items():
                (out / f"{name}.jsonl").write_text("".join(json.dumps(r.as_json(), ensure_ascii=False) + "\n" for r in reads_of))
            args = {
                "a": a_spec, "b": b_spec, "tasks": list(tasks), "limit": limit, "reversed": reversed_variants,
                "top_k": top_k, "concurrency": concurrency, "timeout_s": timeout_s,
            }  # fmt: skip
            write_json(out / "manifest.json", run_manifest("agree", engines=engines, args=args))
            write_json(out / "agreement.json", [row.__dict__ for row in rows])
            (out / "agreement.md").write_text(agreement_table(rows, a_spec, b_spec))
        return rows
    finally:
        for engine in engines.values():
            await engine.aclose()
