"""``decide eval regression``: two read policies on the shipped test samples, every task and question type, one run.

A read policy is what a default changes: the prompt layout (text, answer lead, label styles of noul,
choice and score questions) and the prior-correction policy, written ``LAYOUT:PRIOR`` (e.g.
``decide-prompt/4:choice``). Both policies read every task's test sample through one engine, as
``decide eval tasks`` does (resumable runs ``<out>/baseline`` and ``<out>/candidate``); the table
pairs them record by record (``eval.decisions.compare``: paired bootstrap of the accuracy difference, exact
McNemar) per task and per question type (its tasks' records pooled), beside each side's Wilson 95%
interval and the majority rate (pooled: each task answered with its own majority answer).

A candidate **regresses** a row when its accuracy lies below the baseline's Wilson 95% interval; such
a candidate is not a default (docs/reads.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.decisions.compare import mcnemar_exact, paired_bootstrap
from eval.decisions.runner import run_tasks, run_through_spec
from eval.decisions.score import wilson_interval
from eval.decisions.tasks import TASKS
from eval.evidence.manifest import MANIFEST
from eval.evidence.rows import RECORDS, load_rows
from readers.engines.base import Engine
from readers.prompt import prompt_layout
from service.pipeline.prior import PriorCorrection

QUESTION_TYPES = ("noul", "choice", "score")


@dataclass(frozen=True)
class ReadPolicy:
    prompt_version: str
    prior_correction: PriorCorrection

    @classmethod
    def parse(cls, text: str) -> ReadPolicy:
        """``LAYOUT:PRIOR``, e.g. ``decide-prompt/4:choice``; ValueError naming what is wrong."""
        version, sep, prior = text.rpartition(":")
        if not sep:
            raise ValueError(f"a read policy is LAYOUT:PRIOR (e.g. decide-prompt/4:choice), not {text!r}")
        prompt_layout(version)
        try:
            return cls(version, PriorCorrection(prior))
        except ValueError:
            known = ", ".join(policy.value for policy in PriorCorrection)
            raise ValueError(f"prior correction is one of {known}, not {prior!r}") from None

    def __str__(self) -> str:
        return f"{self.prompt_version}:{self.prior_correction.value}"


async def run_regression(
    engine: Engine,
    out: Path,
    *,
    baseline: ReadPolicy,
    candidate: ReadPolicy,
    tasks: Sequence[str] = tuple(TASKS),
    limit: int | None = None,
    concurrency: int = 4,
) -> dict:
    """Read both policies' runs (resumable) and return :func:`regression_report` over them."""
    for name, policy in (("baseline", baseline), ("candidate", candidate)):
        await run_tasks(
            engine,
            out / name,
            tasks=tasks,
            limit=limit,
            concurrency=concurrency,
            prompt_version=policy.prompt_version,
            prior_correction=policy.prior_correction,
            reversed_order=False,
        )
    return regression_report(out)


def _outcomes(run: Path) -> dict[tuple[str, str], dict]:
    return {
        (row["task"], row["id"]): row
        for row in load_rows(run / RECORDS)
        if row["status"] == "ok" and row["variant"] == "original"
    }


def _compare(a_rows: list[dict], b_rows: list[dict]) -> dict:
    a = np.array([row["predicted"] == row["gold"] for row in a_rows])
    b = np.array([row["predicted"] == row["gold"] for row in b_rows])
    n = len(a)
    difference, lo, hi = paired_bootstrap(a, b)
    a_interval = wilson_interval(int(a.sum()), n)
    return {
        "n": n,
        "majority": Counter(row["gold"] for row in a_rows).most_common(1)[0][1] / n,
        "baseline": float(a.mean()),
        "baseline_ci95": list(a_interval),
        "candidate": float(b.mean()),
        "candidate_ci95": list(wilson_interval(int(b.sum()), n)),
        "difference": difference,
        "difference_ci95": [lo, hi],
        "mcnemar": mcnemar_exact(a, b),
        "regresses": bool(b.mean() < a_interval[0]),
    }


def regression_report(out: Path) -> dict:
    """Per task and per question type, the paired comparison of ``out/baseline`` and ``out/candidate``."""
    runs = {name: json.loads((out / name / MANIFEST).read_text()) for name in ("baseline", "candidate")}
    baseline, candidate = _outcomes(out / "baseline"), _outcomes(out / "candidate")
    if baseline.keys() != candidate.keys():
        raise ValueError("the two runs read different records: rerun both into a fresh --out")
    keys = sorted(baseline)
    tasks = [task for task in TASKS if any(key[0] == task for key in keys)]
    rows = {}
    for task in tasks:
        mine = [key for key in keys if key[0] == task]
        rows[task] = {"type": TASKS[task].question_type} | _compare(
            [baseline[k] for k in mine], [candidate[k] for k in mine]
        )
    types = {}
    for question_type in QUESTION_TYPES:
        mine = [key for key in keys if TASKS[key[0]].question_type == question_type]
        if mine:
            typed = [t for t in tasks if TASKS[t].question_type == question_type]
            pooled = _compare([baseline[k] for k in mine], [candidate[k] for k in mine])
            # Each task's own majority answer, weighted by its records (pooled tasks share no classes).
            pooled["majority"] = sum(rows[t]["majority"] * rows[t]["n"] for t in typed) / pooled["n"]
            types[question_type] = {"tasks": typed} | pooled
    return {
        "policies": {
            name: f"{m['prompt_version']}:{m['args'].get('prior_correction', 'off')}"
            for name, m in runs.items()
        },
        "model": runs["baseline"]["engines"]["run"]["model"],
        "revision": runs["baseline"]["engines"]["run"]["revision"],
        "tasks": rows,
        "types": types,
        "regresses": sorted(name for name, row in [*rows.items(), *types.items()] if row["regresses"]),
    }


def regression_table(report: dict) -> str:
    policies = report["policies"]
    lines = [
        f"Baseline {policies['baseline']}, candidate {policies['candidate']}; model {report['model']} @ {report['revision']}; "
        "shipped test samples, original option order; 95% Wilson intervals, paired bootstrap (10,000 resamples) of the difference.",
        "",
        "| task | type | n | majority | baseline (95% CI) | candidate (95% CI) | candidate − baseline (95% CI) | McNemar p | regresses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def line(name: str, question_type: str, row: dict) -> str:
        b_lo, b_hi = row["baseline_ci95"]
        c_lo, c_hi = row["candidate_ci95"]
        d_lo, d_hi = row["difference_ci95"]
        return (
            f"| {name} | {question_type} | {row['n']} | {row['majority']:.1%} | {row['baseline']:.1%} ({b_lo:.1%}–{b_hi:.1%}) | "
            f"{row['candidate']:.1%} ({c_lo:.1%}–{c_hi:.1%}) | {row['difference'] * 100:+.1f} pts ({d_lo * 100:+.1f} to {d_hi * 100:+.1f}) | "
            f"{row['mcnemar']['p_value']:.3g} | {'**yes**' if row['regresses'] else 'no'} |"
        )

    lines += [line(task, row["type"], row) for task, row in report["tasks"].items()]
    lines += [line(f"all {t} ({', '.join(row['tasks'])})", t, row) for t, row in report["types"].items()]
    lines += ["", "regresses: " + (", ".join(report["regresses"]) or "nothing")]
    return "\n".join(lines) + "\n"


async def evaluate_regression(
    engine_spec: str, out: Path, *, engine_url: str | None = None, model: str | None = None, **options
) -> dict:
    """Open the engine ``engine_spec`` names (``model``: an embedded model's name) and :func:`run_regression` through it."""
    return await run_through_spec(
        run_regression, engine_spec, out, engine_options={"engine_url": engine_url, "model": model}, **options
    )


def side_by_side_table(runs: dict[str, Path]) -> str:
    """Runs of different models (or reads) over records they share, per task: accuracy (Wilson 95%)
    beside the majority rate, each run's median latency, and each run's mean lift over the majority
    rate per question type and over the types (each type counted once: the model rule in docs/reads.md)."""
    outcomes = {name: {key: row for key, row in _outcomes(run).items()} for name, run in runs.items()}
    timings = {
        name: {(r["task"], r["id"]): r.get("latency_ms") for r in load_rows(run / RECORDS, timings=True)}
        for name, run in runs.items()
    }
    keys = sorted(set.intersection(*(set(rows) for rows in outcomes.values())))
    names = list(runs)
    lines = [
        f"| task | type | n | majority | {' | '.join(f'{n} (95% CI)' for n in names)} | median ms {' / '.join(names)} |",
        "|---|---|---|---|" + "---|" * len(names) + "---|",
    ]
    lifts: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for task in TASKS:
        mine = [key for key in keys if key[0] == task]
        if not mine:
            continue
        n = len(mine)
        first = outcomes[names[0]]
        majority = Counter(first[k]["gold"] for k in mine).most_common(1)[0][1] / n
        cells, medians = [], []
        for name in names:
            right = sum(outcomes[name][k]["predicted"] == outcomes[name][k]["gold"] for k in mine)
            lo, hi = wilson_interval(right, n)
            cells.append(f"{right / n:.1%} ({lo:.1%}–{hi:.1%})")
            lifts[name].setdefault(TASKS[task].question_type, []).append(right / n - majority)
            medians.append(f"{float(np.median([timings[name][k] for k in mine])):.0f}")
        lines.append(
            f"| {task} | {TASKS[task].question_type} | {n} | {majority:.1%} | {' | '.join(cells)} | {' / '.join(medians)} |"
        )
    lines.append("")
    for name in names:
        per_type = {t: float(np.mean(v)) for t, v in lifts[name].items()}
        cells = ", ".join(f"{t} {v * 100:+.1f}" for t, v in per_type.items())
        lines.append(
            f"{name}: lift over the majority rate, points: {cells}; mean over types {np.mean(list(per_type.values())) * 100:+.1f}"
        )
    return "\n".join(lines) + "\n"
