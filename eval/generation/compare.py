"""Generation runs against a reference run, paired by problem; the sweep table across N runs.

``decide eval compare REF RUN`` on two ``decide eval generate`` runs: per problem, right or wrong in
each; the accuracy difference RUN − REF with the paired bootstrap 95% interval of
:func:`eval.decisions.compare.paired_bootstrap` (10,000 resamples, fixed seed) and the exact McNemar test. An
interval that spans zero reads "no measurable difference". Runs of another task, other data
(sha256), other settings (:data:`eval.generation.run.SETTINGS`) or other problems are refused, and so is a
run with failed records (resume it first: a failed record is not a wrong one).

``decide eval generation-table REF RUN…`` lays N runs out as the study's sweep did: per model,
accuracy per task, Δ against the reference with its interval, and, given throughput runs, the output
tokens/s ratio to the reference at each concurrency. Markdown and a PNG.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from eval.decisions.compare import RESAMPLES, SEED, ComparisonRefused, mcnemar_exact, paired_bootstrap
from eval.evidence.manifest import MANIFEST
from eval.evidence.rows import load_rows
from eval.generation.run import SETTINGS

WITH_TEXT = "correct_with_text"
OUTCOME_LABELS = {"gsm8k": "final number", "bfcl_simple": "server-parsed calls (headline)", WITH_TEXT: "calls read from the text too"}  # fmt: skip


def is_generation_run(run: Path) -> bool:
    path = run / MANIFEST
    return path.is_file() and json.loads(path.read_text()).get("run") == "generate"


def _outcomes(run: Path, outcome: str = "correct") -> tuple[dict[str, Any], dict[str, bool]]:
    """Right or wrong per problem by the row field ``outcome``: ``correct`` (for BFCL, calls the server
    parsed) or ``correct_with_text`` (BFCL counting calls read from the text)."""
    manifest = json.loads((run / MANIFEST).read_text())
    rows = load_rows(run)
    failed = [row["id"] for row in rows if row["status"] != "ok"]
    if failed:
        raise ComparisonRefused(f"{run} has {len(failed)} failed records (e.g. {failed[0]}): resume it first")
    wanted = set(manifest["record_ids"])
    outcomes = {row["id"]: bool(row[outcome]) for row in rows if row["id"] in wanted}
    if len(outcomes) != len(wanted):
        raise ComparisonRefused(
            f"{run} is unfinished: {len(wanted) - len(outcomes)} problems not yet generated"
        )
    return manifest, outcomes


def compare_generation(reference: Path, run: Path, *, outcome: str = "correct") -> dict[str, Any]:
    """``run`` against ``reference``, paired by problem (see the module docstring). BFCL runs also get
    ``with_text``: the same comparison counting calls read from the text where the server parsed none
    (a model whose call format no server parser reads is otherwise 0% by construction)."""
    for path in (reference, run):
        if not is_generation_run(path):
            raise ComparisonRefused(f"{path} is not a `decide eval generate` run")
    ref_manifest, ref = _outcomes(reference, outcome)
    run_manifest, mine = _outcomes(run, outcome)
    for field, a, b in [
        ("data", ref_manifest["data_sha256"], run_manifest["data_sha256"]),
        *((name, ref_manifest["args"].get(name), run_manifest["args"].get(name)) for name in SETTINGS),
    ]:
        if a != b:
            raise ComparisonRefused(f"the runs differ in {field} ({a!r} vs {b!r})")
    if ref.keys() != mine.keys():
        raise ComparisonRefused(
            f"the runs read different problems ({len(ref.keys() - mine.keys())} only in the reference, "
            f"{len(mine.keys() - ref.keys())} only in the run)"
        )
    ids = sorted(ref)
    a = np.array([ref[i] for i in ids])
    b = np.array([mine[i] for i in ids])
    difference, lo, hi = paired_bootstrap(a, b)
    report = {
        "task": run_manifest["args"]["task"],
        "outcome": outcome,
        "reference": {"run": str(reference), "model": ref_manifest["server"]["model"]},
        "run": {"run": str(run), "model": run_manifest["server"]["model"]},
        "n": len(ids),
        "accuracy_reference": float(a.mean()),
        "accuracy": float(b.mean()),
        "difference": difference,
        "difference_ci95": [lo, hi],
        "measurable": not (lo <= 0.0 <= hi),
        "mcnemar": mcnemar_exact(a, b),
        "resamples": RESAMPLES,
        "seed": SEED,
    }
    if outcome == "correct" and report["task"] == "bfcl_simple":
        report["with_text"] = compare_generation(reference, run, outcome=WITH_TEXT)
    return report


def _points(value: float) -> str:
    return f"{value * 100:+.1f}"


def verdict(report: dict[str, Any]) -> str:
    lo, hi = report["difference_ci95"]
    interval = f"{_points(report['difference'])} pts ({_points(lo)} to {_points(hi)})"
    return interval if report["measurable"] else f"{interval}, no measurable difference"


def compare_generation_table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['task']}: reference {report['reference']['model']} ({report['reference']['run']}), "
        f"run {report['run']['model']} ({report['run']['run']}); {report['n']} problems paired, bootstrap "
        f"({report['resamples']:,} resamples, seed {report['seed']}), exact McNemar.",
        "",
        "| scored by | reference accuracy | run accuracy | run − reference (95% CI) | right in reference only / run only | McNemar p |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for entry in (report, report.get("with_text")):
        if entry is not None:
            m = entry["mcnemar"]
            lines.append(
                f"| {OUTCOME_LABELS[entry['task'] if entry['outcome'] == 'correct' else entry['outcome']]} | {entry['accuracy_reference']:.1%} | {entry['accuracy']:.1%} | "
                f"{verdict(entry)} | {m['only_a_right']} / {m['only_b_right']} | {m['p_value']:.3g} |"
            )
    return "\n".join(lines) + "\n"


def sweep_rows(
    reference: list[Path], runs: list[list[Path]], *, throughput: dict[str, Path | list[Path]] | None = None
) -> list[dict[str, Any]]:
    """One row per model: ``reference`` the reference model's runs (one per task), ``runs`` each
    other model's runs; ``throughput`` model name → its ``decide eval throughput`` directory, or
    several (sweeps of different prompt shapes, merged)."""
    from eval.generation.throughput import load_summary

    def load(model: str) -> dict[str, Any]:
        paths = throughput[model]
        cells: dict[str, Any] = {}
        for path in [paths] if isinstance(paths, Path) else paths:
            for key, cell in load_summary(path).items():
                if key in cells:  # two sweeps of one cell: neither may silently stand for the other
                    raise ComparisonRefused(
                        f"{model}: {key} is in more than one throughput directory ({path})"
                    )
                cells[key] = cell
        return cells

    throughput = throughput or {}
    ref_by_task = {json.loads((r / MANIFEST).read_text())["args"]["task"]: r for r in reference}
    ref_model = json.loads((reference[0] / MANIFEST).read_text())["server"]["model"]
    ref_speed = load(ref_model) if ref_model in throughput else None
    rows = []
    for group in [reference, *runs]:
        model = json.loads((group[0] / MANIFEST).read_text())["server"]["model"]
        row: dict[str, Any] = {
            "model": model,
            "reference": group is reference,
            "tasks": {},
            "speed_ratio": {},
        }
        for run in group:
            task = json.loads((run / MANIFEST).read_text())["args"]["task"]
            if group is reference:
                for outcome in ["correct", WITH_TEXT] if task == "bfcl_simple" else ["correct"]:
                    _, outcomes = _outcomes(run, outcome)
                    row["tasks"][_column(task, outcome)] = {"n": len(outcomes), "accuracy": float(np.mean(list(outcomes.values())))}  # fmt: skip
            elif task in ref_by_task:
                report = compare_generation(ref_by_task[task], run)
                for entry in (report, report.get("with_text")):
                    if entry is not None:
                        row["tasks"][_column(task, entry["outcome"])] = {"n": entry["n"], "accuracy": entry["accuracy"], "comparison": entry}  # fmt: skip
        if ref_speed is not None and model in throughput:
            speed = load(model)
            for key, entry in speed.items():
                if key in ref_speed and ref_speed[key]["output_tokens_per_s"]:
                    row["speed_ratio"][key] = (
                        entry["output_tokens_per_s"] / ref_speed[key]["output_tokens_per_s"]
                    )
        rows.append(row)
    return rows


def sweep_markdown(rows: list[dict[str, Any]]) -> str:
    tasks = sorted({task for row in rows for task in row["tasks"]})
    speeds = sorted({key for row in rows for key in row["speed_ratio"]}, key=_speed_order)
    header = (
        ["model"]
        + [f"{t} accuracy (95% CI)" for t in tasks]
        + [f"{t} Δ vs reference (95% CI)" for t in tasks]
    )
    header += [f"speed ×ref {key}" for key in speeds]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["model"] + (" (reference)" if row["reference"] else "")]
        cells += [_accuracy(row["tasks"][t]) if t in row["tasks"] else "—" for t in tasks]
        cells += [
            "—" if row["reference"] or t not in row["tasks"] else verdict(row["tasks"][t]["comparison"])
            for t in tasks
        ]
        cells += [f"{row['speed_ratio'][k]:.2f}" if k in row["speed_ratio"] else "—" for k in speeds]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _accuracy(entry: dict[str, Any]) -> str:
    """Accuracy with its Wilson 95% interval (a small model's 0% is still an estimate over n problems)."""
    from eval.decisions.score import wilson_interval

    lo, hi = wilson_interval(round(entry["accuracy"] * entry["n"]), entry["n"])
    return f"{entry['accuracy']:.1%} ({lo:.1%}–{hi:.1%}, n {entry['n']})"


def _column(task: str, outcome: str) -> str:
    return task if outcome == "correct" else f"{task} with text calls"


def _speed_order(key: str) -> tuple[str, int]:
    shape, _, concurrency = key.rpartition("@c")
    return (shape, int(concurrency))


def speed_series(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(model, prompt shape) → [(concurrency, output tok/s ÷ the reference's), …] in concurrency
    order, for every model but the reference (whose ratios are 1 by definition)."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        if row["reference"]:
            continue
        for key in sorted(row["speed_ratio"], key=_speed_order):
            shape, concurrency = _speed_order(key)
            series.setdefault((row["model"], shape), []).append((concurrency, row["speed_ratio"][key]))
    return series


def plot_sweep_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy per task and model, each bar with its Wilson 95% interval (always inside 0–100%; the
    paired interval of the difference against the reference is in the table: drawn on the accuracy
    scale it can reach below zero), and, when throughput was given, a last panel of each model's
    speed against the reference's per prompt shape and concurrency."""
    from eval.decisions.score import wilson_interval
    from eval.evidence.figures import _save, plt

    tasks = sorted({task for row in rows for task in row["tasks"]})
    speeds = speed_series(rows)
    panels = max(1, len(tasks) + bool(speeds))
    figure, axes = plt.subplots(1, panels, figsize=(4.0 * panels, 3.6), dpi=120, squeeze=False)
    if speeds:
        axis = axes[0][-1]
        for (model, shape), points in speeds.items():
            axis.plot([c for c, _ in points], [r for _, r in points], marker="o", label=f"{model}, {shape}")
        concurrencies = sorted({c for points in speeds.values() for c, _ in points})
        axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="reference")
        axis.set_xscale("log")
        axis.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axis.minorticks_off()
        axis.set_xlabel("concurrent requests")
        axis.set_ylabel("output tok/s ÷ reference")
        axis.set_title("speed against the reference", fontsize=9)
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside: inside it hides points
        axis.grid(alpha=0.3)
    for axis, task in zip(axes[0], tasks):
        names, values, low, high = [], [], [], []
        for row in rows:
            if task not in row["tasks"]:
                continue
            entry = row["tasks"][task]
            lo, hi = wilson_interval(round(entry["accuracy"] * entry["n"]), entry["n"])
            names.append(row["model"] + (" (ref)" if row["reference"] else ""))
            values.append(entry["accuracy"] * 100)
            low.append(max(0.0, values[-1] - lo * 100))  # rounding can put 0 of n a hair below 0
            high.append(max(0.0, hi * 100 - values[-1]))
        axis.bar(range(len(names)), values, yerr=[low, high], capsize=4, color="#4c72b0")
        axis.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        axis.set_ylabel("accuracy, % (Wilson 95%)")
        axis.set_ylim(0, max(10.0, max(v + h for v, h in zip(values, high)) * 1.1))
        axis.set_title(task, fontsize=9)
        axis.grid(axis="y", alpha=0.3)
    _save(figure, path)
