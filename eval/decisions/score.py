"""``decide eval score DIR``: per-task figures from a run's evidence files only.

Conventions: accuracy with a Wilson 95% interval; ECE of the top class on 15 equal-width bins (see
``calibration.metrics``), beside its finite-sample floor (the ECE perfectly calibrated draws show at
the same n: median and 95% range, ``calibration.metrics.ece_floor``); Brier multiclass; "after 50" = temperature fitted on 50 records (with their gold answers) of
one random half, ECE of the other half (single split = split 0 of the seeded sequence; the mean is over
20 splits). Records whose read failed are counted on their own line and excluded from every metric;
the last row written for a record wins (a resumed run may retry a failed one).

Score tasks (levels in order) also get ordinal figures, in a second table: the MAE of the expected
level against the gold level, its baseline (always the median gold level of the scored records: the
constant answer with the least MAE, as the majority is the one with the best accuracy) and the
Spearman rank correlation of expected and gold level (``calibration.metrics``; null/"—" where a side
is constant). Choice and noul tasks report as before.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path

import numpy as np

from calibration.metrics import (
    N_BINS,
    brier_loss,
    ece,
    ece_floor,
    level_absolute_error,
    level_spearman_score,
    median_level_error,
)
from calibration.temperature import as_logits
from eval.decisions.gold_curve import gold_curve
from eval.decisions.risk_coverage import write_risk_coverage
from eval.decisions.tasks import TASKS
from eval.evidence.manifest import MANIFEST, write_json
from eval.evidence.rows import RECORDS, load_rows, rows_arrays
from readers.probabilities import DEFAULT_FLOOR_OFFSET, softmax

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion.

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    """
    if n == 0:
        return (float("nan"), float("nan"))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


def at_top_k_bound(row: dict, floor_offset: float = DEFAULT_FLOOR_OFFSET) -> dict[str, float]:
    """Probabilities with every missing label at the top-k bound (the lowest returned log-prob),
    the most generous value a missing label can have, instead of the floor. A floor-bounded read is
    never prior-corrected (``service.pipeline.prior.served_prior``), so its answer is the raw read this redoes."""
    reading = row["reading"]
    if reading["floor_logprob"] is None:
        return row["probabilities"]
    bound = reading["floor_logprob"] + floor_offset
    options = row["options"]
    logprobs = [
        reading["label_logprobs"][o] if reading["label_logprobs"][o] is not None else bound for o in options
    ]
    return dict(zip(options, softmax(logprobs)))


def after_50(p: np.ndarray, y: np.ndarray, *, seed: int = 0) -> dict:
    """ECE after 50 gold answers: split 0 and the 20-split mean, and the median fitted T (the
    gold-curve protocol, same splits and draws as ``decide eval gold-curve``)."""
    (point,) = gold_curve(as_logits(p), y, counts=(50,), splits=20, seed=seed)["points"]
    return {
        "ece_after_50_single": point["ece_split0"],
        "ece_after_50_mean": point["ece_mean"],
        "temperature_at_50": point["temperature_median"],
    }


def is_score_task(rows: list[dict]) -> bool:
    """Whether rows are a score question's: the row's ``question_type`` where written (the suite's),
    else its task's; a task this code does not ship is not."""
    row = rows[0]
    task = TASKS.get(row["task"])
    return (row.get("question_type") or (task.question_type if task else None)) == "score"


def ordinal_scores(p: np.ndarray, y: np.ndarray) -> dict:
    """A score task's level figures: expected-level MAE, the median-level baseline's, Spearman (None where undefined).

    ``p``'s columns follow the rows' options, a score task's levels "0", "1", … in order
    (``eval.decisions.tasks``), so a column index and a gold index are levels."""
    spearman = level_spearman_score(p, y)
    return {
        "mae_expected_level": level_absolute_error(p, y),
        "median_level_mae": median_level_error(y),
        "spearman": None if math.isnan(spearman) else spearman,
    }


def score_task(rows: list[dict], *, seed: int = 0, floor_offset: float = DEFAULT_FLOOR_OFFSET) -> dict:
    rows = sorted(rows, key=lambda row: (row["id"], row["variant"]))
    original = [row for row in rows if row["variant"] == "original"]
    ok = [row for row in original if row["status"] == "ok"]
    errors = sum(row["status"] != "ok" for row in rows)  # every variant
    if not ok:
        return {"n": 0, "errors": errors}
    p, y = rows_arrays(ok)
    correct = int((p.argmax(axis=1) == y).sum())
    lo, hi = wilson_interval(correct, len(ok))
    majority = Counter(row["gold"] for row in ok).most_common(1)[0][1] / len(ok)
    bounded, _ = rows_arrays(ok, lambda row: at_top_k_bound(row, floor_offset))
    result = {
        "n": len(ok),
        "errors": errors,
        "accuracy": correct / len(ok),
        "accuracy_ci95": [lo, hi],
        "majority": majority,
        "ece": ece(p, y, N_BINS),
        "ece_floor": ece_floor(p, N_BINS, seed=seed),
        "brier": brier_loss(p, y),
        **(after_50(p, y, seed=seed) if len(ok) >= 100 else {}),
        "all_labels_returned": float(np.mean([row["reading"]["exact"] for row in ok])),
        "ece_at_top_k_bound": ece(bounded, y, N_BINS),
        "ece_after_50_at_top_k_bound": after_50(bounded, y, seed=seed)["ece_after_50_mean"]
        if len(ok) >= 100
        else None,
        "median_latency_ms": statistics.median(row["latency_ms"] for row in ok),
        "abstentions": int(sum(not row["reading"]["informative"] for row in ok)),
        **(ordinal_scores(p, y) if is_score_task(ok) else {}),
    }
    reversed_rows = {row["id"]: row for row in rows if row["variant"] == "reversed" and row["status"] == "ok"}
    if reversed_rows:
        paired = [(row, reversed_rows[row["id"]]) for row in ok if row["id"] in reversed_rows]
        result["reversed_changes"] = sum(a["predicted"] != b["predicted"] for a, b in paired)
        result["reversed_pairs"] = len(paired)
    return result


def score_run(run: Path, *, seed: int = 0) -> dict:
    manifest = json.loads((run / MANIFEST).read_text())
    rows = load_rows(run / RECORDS, timings=True)  # median latency per task
    planned = manifest["args"]["tasks"]
    tasks = sorted(
        {row["task"] for row in rows},
        key=lambda task: (planned.index(task) if task in planned else len(planned), task),
    )
    report = {
        "run": str(run),
        "n_bins": N_BINS,
        "engine": manifest["engines"]["run"],
        "status": manifest["status"],
        "tasks": {
            task: score_task(
                [row for row in rows if row["task"] == task],
                seed=seed,
                floor_offset=manifest["args"].get("floor_offset", DEFAULT_FLOOR_OFFSET),
            )
            for task in tasks
        },
        "missing_records": manifest.get("records", len(rows)) - len(rows),
    }
    latency = run / "latency.json"
    if latency.is_file():
        report["latency"] = json.loads(latency.read_text())
    return report


def floor_cell(scored: dict) -> str:
    """The ECE floor (``calibration.metrics.ece_floor``) as "median (lo–hi)"; "—" in reports scored before it."""
    floor = scored.get("ece_floor")
    return "—" if floor is None else f"{floor['median']:.3f} ({floor['lo']:.3f}–{floor['hi']:.3f})"


def score_table(report: dict) -> str:
    engine = report["engine"]
    lines = [
        f"Engine {engine['kind']} ({engine['read_mode']}, top-k {engine['top_k']}), model {engine['model']} @ {engine['revision']}; "
        f"ECE over {report['n_bins']} bins; run status {report['status']}; records planned but not in the evidence: {report['missing_records']}.",
        "",
        "| task | n | accuracy (95% CI) | majority | ECE | ECE floor (95% range) | Brier | ECE after 50 gold answers, split 0 / 20-split mean | median T at 50 | reversed-order changes | all labels returned | ECE raw / after 50, missing at top-k bound | median ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, s in report["tasks"].items():
        if not s["n"]:
            lines.append(f"| {task} | 0 | — | — | — | — | — | — | — | — | — | — | — | {s['errors']} |")
            continue
        lo, hi = s["accuracy_ci95"]
        changes = f"{s['reversed_changes']} of {s['reversed_pairs']}" if "reversed_changes" in s else "—"
        after = (
            f"{s['ece_after_50_single']:.3f} / {s['ece_after_50_mean']:.3f}"
            if "ece_after_50_single" in s
            else "—"
        )
        t50 = f"{s['temperature_at_50']:.2f}" if "temperature_at_50" in s else "—"
        bound_after = (
            f"{s['ece_after_50_at_top_k_bound']:.3f}"
            if s.get("ece_after_50_at_top_k_bound") is not None
            else "—"
        )
        lines.append(
            f"| {task} | {s['n']} | {s['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | {s['majority']:.1%} | {s['ece']:.3f} | {floor_cell(s)} | {s['brier']:.3f} | "
            f"{after} | {t50} | {changes} | {s['all_labels_returned']:.1%} | {s['ece_at_top_k_bound']:.3f} / {bound_after} | "
            f"{s['median_latency_ms']:.0f} | {s['errors']} |"
        )
    lines += ordinal_table(report)
    if "latency" in report:
        lat = report["latency"]
        lines += ["", f"Latency at concurrency 1: median {lat['c1']['p50_ms']:.0f} ms, p90 {lat['c1']['p90_ms']:.0f} ms; "
                  f"decisions/s at concurrency 8: {lat['c8']['decisions_per_s']:.2f} ({lat['machine']['cpu']}, {lat['machine']['cores']} cores)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def ordinal_table(report: dict) -> list[str]:
    """The score tasks' level figures as lines of a second table (none when no score task was scored)."""
    scored = {task: s for task, s in report["tasks"].items() if "mae_expected_level" in s}
    if not scored:
        return []
    lines = [
        "",
        "Score tasks: expected level Σ i·pᵢ against the gold level; baseline: always the median gold level.",
        "",
        "| score task | n | accuracy of the most probable level | MAE of the expected level | MAE, median level | Spearman |",
        "|---|---|---|---|---|---|",
    ]
    for task, s in scored.items():
        spearman = "—" if s["spearman"] is None else f"{s['spearman']:.3f}"
        lines.append(
            f"| {task} | {s['n']} | {s['accuracy']:.1%} | {s['mae_expected_level']:.3f} | {s['median_level_mae']:.3f} | {spearman} |"
        )
    return lines


def write_figures(run: Path, report: dict) -> None:
    """accuracy.png (accuracy with Wilson CIs and the majority baseline) and reliability-<task>.png."""
    from calibration.metrics import reliability_bins
    from eval.evidence.figures import plot_accuracy, plot_reliability_raw

    plot_accuracy(report, run / "accuracy.png")
    rows = load_rows(run / RECORDS)
    for task in report["tasks"]:
        ok = [
            row
            for row in rows
            if row["task"] == task and row["variant"] == "original" and row["status"] == "ok"
        ]
        if ok:
            p, y = rows_arrays(ok)
            plot_reliability_raw(
                reliability_bins(p, y),
                run / f"reliability-{task}.png",
                title=f"{task}: raw reads, {len(ok)} records",
            )


def write_score(run: Path, *, seed: int = 0) -> dict:
    """Score a run from its evidence and write score.json, score.md and the figures beside it."""
    report = score_run(run, seed=seed)
    write_json(run / "score.json", report)
    (run / "score.md").write_text(score_table(report))
    write_figures(run, report)
    write_risk_coverage(
        run
    )  # risk-coverage.json and risk-coverage-<task>.png (eval/decisions/risk_coverage.py)
    return report
