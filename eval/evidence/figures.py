"""Figures from evidence: gold curves and reliability diagrams (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from opendecide.extras import needs_extra

with needs_extra("plots", "figures"):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers or CI
    import matplotlib.pyplot as plt


def _save(figure, path: Path) -> None:
    """Lay out, write and release a figure (pyplot keeps every open figure alive otherwise)."""
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_gold_curves(report: dict, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for task, entry in report["tasks"].items():
        points = entry["curve"]["points"]
        xs = [p["n_gold"] for p in points]
        ys = [p["ece_mean"] for p in points]
        errors = [p["ece_std"] for p in points]
        axis.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=task)
    n_bins = next(iter(report["tasks"].values()))["curve"]["n_bins"] if report["tasks"] else 15
    axis.set_xlabel("decisions with gold answers used to fit the temperature")
    axis.set_ylabel(f"held-out ECE ({n_bins} bins)")
    axis.set_title("ECE after N gold answers (mean ± sd over splits)")
    axis.grid(alpha=0.3)
    axis.legend()
    _save(figure, path)


def plot_reliability(diagrams: dict, path: Path, *, title: str) -> None:
    figure, axes = plt.subplots(1, 2, figsize=(8.4, 4.0), dpi=120, sharey=True)
    for axis, (name, label) in zip(
        axes,
        [("raw", "raw (T = 1)"), ("after_50", f"T = {diagrams['temperature_50']:.2f} (50 gold answers)")],
    ):
        bins = diagrams[name]
        centres = [(b["lo"] + b["hi"]) / 2 for b in bins]
        widths = [b["hi"] - b["lo"] for b in bins]
        axis.bar(
            centres,
            [b["accuracy"] for b in bins],
            width=widths,
            edgecolor="black",
            alpha=0.7,
            label="accuracy",
        )
        axis.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
        axis.scatter(
            [b["confidence"] for b in bins],
            [b["accuracy"] for b in bins],
            color="black",
            s=[8 + b["count"] for b in bins],
            zorder=3,
            label="bin (size = count)",
        )
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_xlabel("top-label confidence")
        axis.set_title(label)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(loc="upper left", fontsize=8)
    figure.suptitle(title, fontsize=10)
    _save(figure, path)


def plot_accuracy(report: dict, path: Path) -> None:
    tasks = [task for task, s in report["tasks"].items() if s["n"]]
    figure, axis = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    accuracy = [report["tasks"][t]["accuracy"] for t in tasks]
    errors = [
        [a - report["tasks"][t]["accuracy_ci95"][0] for a, t in zip(accuracy, tasks)],
        [report["tasks"][t]["accuracy_ci95"][1] - a for a, t in zip(accuracy, tasks)],
    ]
    axis.bar(tasks, accuracy, yerr=errors, capsize=4, alpha=0.8, label="accuracy (Wilson 95%)")
    axis.scatter(
        tasks,
        [report["tasks"][t]["majority"] for t in tasks],
        marker="_",
        s=600,
        color="black",
        label="majority baseline",
        zorder=3,
    )
    axis.set_ylim(0, 1)
    axis.set_ylabel("accuracy")
    axis.set_title(
        f"{report['engine']['model']} ({report['engine']['kind']}, {report['engine']['read_mode']})"
    )
    axis.legend()
    axis.grid(alpha=0.3, axis="y")
    _save(figure, path)


def plot_reliability_raw(bins: list[dict], path: Path, *, title: str) -> None:
    figure, axis = plt.subplots(figsize=(4.4, 4.0), dpi=120)
    axis.bar(
        [(b["lo"] + b["hi"]) / 2 for b in bins],
        [b["accuracy"] for b in bins],
        width=[b["hi"] - b["lo"] for b in bins],
        edgecolor="black",
        alpha=0.7,
    )
    axis.plot([0, 1], [0, 1], linestyle="--", color="grey")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1)
    axis.set_xlabel("top-label confidence")
    axis.set_ylabel("accuracy")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    _save(figure, path)


def plot_costs(rows: list[dict], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7.0, 0.5 + 0.45 * len(rows)), dpi=120)
    labels = [f"{row['label']} · {row['price']}" for row in rows]
    axis.barh(labels, [row["usd_per_million"] for row in rows], alpha=0.8)
    for y, row in enumerate(rows):
        axis.text(row["usd_per_million"], y, f" ${row['usd_per_million']:.2f}", va="center", fontsize=8)
    axis.set_xlabel("$ per million decisions")
    axis.invert_yaxis()
    axis.grid(alpha=0.3, axis="x")
    _save(figure, path)


def plot_risk_coverage(points: list[dict], path: Path, *, title: str) -> None:
    """Risk against coverage, with a few thresholds written on the curve (to pick ``x_min_confidence``)."""
    figure, axis = plt.subplots(figsize=(5.2, 4.0), dpi=120)
    coverage = [p["coverage"] for p in points]
    risk = [p["risk"] for p in points]
    axis.plot(coverage, risk, marker=".", markersize=3)
    step = max(1, len(points) // 6)
    for p in points[::step]:
        axis.annotate(
            f"≥{p['threshold']:.2f}",
            (p["coverage"], p["risk"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(3, 3),
        )
    axis.set_xlim(0, 1.02)
    axis.set_ylim(0, max([0.05, *risk]) * 1.1)
    axis.set_xlabel("coverage (share answered at confidence ≥ threshold)")
    axis.set_ylabel("risk (error rate of answered)")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    _save(figure, path)


def plot_few_shot_curves(report: dict, path: Path, ece: str = "ece") -> None:
    """Accuracy and ECE against N per question type, one line per mode (the docs' figure); the ECE
    figure is ``ece``, the one the round's rule reads (``task_ece`` from round 5, ``pooled_ece`` in
    round 4, else ``ece``, the mean of the splits')."""
    types = list(report["types"])
    figure, axes = plt.subplots(2, len(types), figsize=(4.2 * len(types), 6.4), dpi=110, squeeze=False)
    counts = report["counts"]
    # One colour per mode across the panels: a type lacking a mode (score-only ones) must not shift the rest.
    every = list(dict.fromkeys(mode for entry in report["types"].values() for mode in entry["modes"]))
    colour = {mode: f"C{i % 10}" for i, mode in enumerate(every)}
    for column, question_type in enumerate(types):
        entry = report["types"][question_type]
        majority = float(_mean([_mean(report["tasks"][t]["majority"]) for t in entry["tasks"]]))
        for mode, curve in entry["modes"].items():
            for row, metric in enumerate(("accuracy", ece)):
                axes[row][column].plot(
                    counts,
                    [curve[str(n)][metric] for n in counts],
                    marker="o",
                    label=mode,
                    color=colour[mode],
                )
        axes[0][column].axhline(majority, color="grey", linestyle="--", label="majority rate")
        axes[0][column].set_title(f"{question_type} ({', '.join(entry['tasks'])})")
        axes[0][column].set_ylabel("held-out accuracy")
        pooled = {
            "pooled_ece": ", splits pooled",
            "task_ece": ", each task's splits pooled, tasks' mean",
        }.get(ece, "")
        axes[1][column].set_ylabel(f"held-out ECE ({report['n_bins']} bins{pooled})")
        axes[1][column].set_xlabel("gold answers fitted on (N)")
        for axis in (axes[0][column], axes[1][column]):
            axis.grid(alpha=0.3)
    handles = {label: h for axis in axes[0] for h, label in zip(*axis.get_legend_handles_labels())}
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7)  # every mode any panel draws
    _save(figure, path)


def _mean(values) -> float:
    return sum(values) / len(values)
