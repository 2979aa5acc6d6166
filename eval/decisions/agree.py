"""Agreement between two engines or read modes over the same records (``decide eval agree``).

The local analogue of "the same checkpoint on TPU and L4": per task, how many records get the same
predicted label, the largest and median absolute probability difference, and every record whose
label differs, with both margins and whether either read missed labels.

A run directory holds ``a.jsonl.gz`` and ``b.jsonl.gz`` (record rows, written resumably, with their
timings files), ``manifest.json``
(with ``reads``: where each side's rows are), ``agreement.json`` and ``agreement.md``. Reads of side a
that an earlier run already made (same engine spec, tasks, limit and variants) are not made again:
``reuse_a`` points the manifest at that run's ``a.jsonl.gz``, so one set of reads backs several runs.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.decisions.tasks import TASKS, load_sample, spread
from eval.evidence.manifest import MANIFEST, Images, RunRefused, run_manifest, write_json
from eval.evidence.rows import ROWS_SUFFIX, RecordRow, RecordWriter, load_rows, read_rows, row_key


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


def agreement(task: str, a: Sequence[RecordRow], b: Sequence[RecordRow]) -> Agreement:
    """Compare two reads of the same records (record rows, matched by id and variant)."""
    b_by_key = {(row["id"], row["variant"]): row for row in b}
    if len(b_by_key) != len(a) or any((row["id"], row["variant"]) not in b_by_key for row in a):
        raise ValueError("the two runs did not read the same records")
    failed = [row["id"] for row in [*a, *b] if row["status"] != "ok"]
    if failed:
        raise ValueError(
            f"{len(failed)} reads failed (e.g. {failed[0]}): rerun with the same --out to retry them"
        )
    deltas, differing, same = [], [], 0
    for row_a in a:
        row_b = b_by_key[(row_a["id"], row_a["variant"])]
        pa, pb = row_a["probabilities"], row_b["probabilities"]
        deltas.append(max(abs(pa[o] - pb[o]) for o in pa))
        if row_a["predicted"] == row_b["predicted"]:
            same += 1
            continue
        differing.append(
            {
                "id": row_a["id"],
                "variant": row_a["variant"],
                "a_label": row_a["predicted"],
                "b_label": row_b["predicted"],
                "a_margin": margin(pa),
                "b_margin": margin(pb),
                "a_missing_labels": row_a["reading"]["labels_total"] - row_a["reading"]["labels_returned"],
                "b_missing_labels": row_b["reading"]["labels_total"] - row_b["reading"]["labels_returned"],
            }
        )
    return Agreement(
        task, len(a), same, max(deltas, default=0.0), statistics.median(deltas) if deltas else 0.0, differing
    )


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
        lines += [
            "",
            "| id | variant | a label (margin) | b label (margin) | missing labels a / b |",
            "|---|---|---|---|---|",
        ]
        for case in cases:
            lines.append(
                f"| {case['id']} | {case['variant']} | {case['a_label']} ({case['a_margin']:.3f}) | "
                f"{case['b_label']} ({case['b_margin']:.3f}) | {case['a_missing_labels']} / {case['b_missing_labels']} |"
            )
    return "\n".join(lines) + "\n"


def agreement_reads(run: Path) -> dict[str, Path]:
    """Where an agreement run's record rows are, side by side (``a`` may be another run's)."""
    manifest = json.loads((run / MANIFEST).read_text())
    return {side: (run / path).resolve() for side, path in manifest["reads"].items()}


def _reused(reuse_a: Path, args: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The a rows and engine description of an earlier agreement run, checked to be the same reads."""
    from readers.engines import ReadMode, parse_engine_spec

    theirs = json.loads((reuse_a / MANIFEST).read_text())
    kind, read_mode, _ = parse_engine_spec(args["a"])
    # --top-k reaches side a only when a reads top-k (local:topk) or is a vLLM engine
    checked = ("a", "tasks", "limit", "reversed") + (
        ("top_k",) if kind == "vllm" or read_mode is ReadMode.TOPK else ()
    )
    for field_name in checked:
        if theirs["args"].get(field_name) != args[field_name]:
            raise RunRefused(
                f"{reuse_a} read side a with {field_name} {theirs['args'].get(field_name)!r}, not {args[field_name]!r}"
            )
    return agreement_reads(reuse_a)["a"], theirs["engines"]["a"]


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
    reuse_a: Path | None = None,
    images: Images | None = None,
) -> list[Agreement]:
    """Read the same records through engines ``a_spec`` and ``b_spec`` (side a from ``reuse_a``'s
    run when given); with ``out``, write the evidence and the report there.

    ValueError naming ``--reuse-a`` when it comes without ``--out``, before anything is read."""
    from readers.engines import open_engine_spec
    from readers.reader import Reader

    if reuse_a is not None and out is None:
        raise ValueError("--reuse-a needs --out: the run's manifest is what points at the reused reads")

    args = {
        "a": a_spec, "b": b_spec, "tasks": list(tasks), "limit": limit, "reversed": reversed_variants,
        "top_k": top_k, "concurrency": concurrency, "timeout_s": timeout_s,
    }  # fmt: skip
    jobs = []
    for task_name in tasks:
        task = TASKS[task_name]
        for variant in task.variants if reversed_variants else ("original",):
            jobs += [task.read_job(record, variant) for record in spread(load_sample(task_name), limit)]
    reads = {side: out / f"{side}{ROWS_SUFFIX}" if out else None for side in ("a", "b")}
    described = {}
    if reuse_a is not None:
        reads["a"], described["a"] = _reused(reuse_a, args)
    rows: dict[str, list[RecordRow]] = {}
    async with AsyncExitStack() as stack:
        engines = {}
        for side, spec in (("a", a_spec), ("b", b_spec)):
            if side in described:
                continue
            engines[side] = await stack.enter_async_context(
                await open_engine_spec(spec, top_k=top_k, engine_url=engine_url, timeout_s=timeout_s)
            )
            reader = Reader(engines[side])
            if reads[side] is None:
                rows[side] = await read_rows(reader, jobs, concurrency=concurrency)
                continue
            async with RecordWriter(reads[side]) as sink:
                await sink.read_all(reader, jobs, concurrency=concurrency)
        manifest = run_manifest("agree", engines=engines, args=args, images=images) if out else None
    order = {row_key(base): index for index, (base, _, _) in enumerate(jobs)}  # cases listed in reading order
    for side, path in reads.items():
        if path is not None:
            rows[side] = sorted(
                (row for row in load_rows(path) if row_key(row) in order), key=lambda row: order[row_key(row)]
            )
    result = [
        agreement(
            name, [r for r in rows["a"] if r["task"] == name], [r for r in rows["b"] if r["task"] == name]
        )
        for name in tasks
    ]
    if out is not None:
        manifest["engines"] = {
            "a": described.get("a") or manifest["engines"]["a"],
            "b": manifest["engines"]["b"],
        }
        manifest["reads"] = {side: os.path.relpath(path, out) for side, path in reads.items()}
        write_json(out / MANIFEST, manifest)
        write_json(out / "agreement.json", [row.__dict__ for row in result])
        (out / "agreement.md").write_text(agreement_table(result, a_spec, b_spec))
    return result
