"""``decide eval dev-reads``: the read defaults chosen on development records, by a rule fixed before the run.

Choosing a read by the records that then measure it fits the read to its test sample. This reads
each named layout of the registry (``readers.prompt.PROMPT_LAYOUTS``: the prompt text, the answer
lead, the label styles of noul/choice questions and of score levels) on the shipped **dev** split of
every task (``eval.decisions.tasks``: disjoint from the test samples the evals report), as ``decide eval
tasks`` does, one resumable run per layout (``<out>/<layout>/``) with the content-free prior
correction applied to every question (``--prior-correction all``). Each row keeps the model's own
read beside the corrected answer, so one run scores a question type both with and without the
prior (``service.pipeline.prior``).

The rule, fixed before a run (docs/reads.md):

1. Candidates: each state-first layout of the registry (every question's prompt opens with the state,
   so a request's questions share it: the service's one path), each with the prior on and off.
   Question-first layouts (decide-prompt/1) are read and reported for reference, never chosen.
2. For choice and score questions, each type on its own: the candidate with the highest mean lift
   (accuracy − the task's majority rate) over that type's tasks; a tie goes to the lower mean Brier
   score (to 4 places), then to the current layout, then to the raw read.
   For yes/no (noul) questions, whose answer is the probability itself: among the candidates whose
   mean lift is not more than ``NOUL_LIFT_MARGIN`` (2 points) below the best candidate's, the one
   with the lowest mean Brier score (to 4 places); a tie goes to the higher lift, then to the current
   layout, then to the raw read.
3. The chosen candidates compose the default: each type read under its chosen layout's text, lead
   and labels (``PromptLayout.by_type``), the prior divided out for the types whose chosen candidate
   has it. A type whose best candidate stays under its majority rate is named as such.

The yes/no part of rule 2 was written after the dev and test figures of decide-prompt/3 and /4 were
known (docs/reads.md, "Yes/no reads: calibration"): the lift rule had kept /4's reads, which answer
"No" to nearly every tweet; so the read it picks is confirmed on irony rows neither shipped sample
holds (``evidence/reads/noul-fresh/``) before it becomes a default.

Reported beside the rule, not part of it: score tasks' MAE of the expected level and Spearman
correlation, the answer counts per option (a read that collapses onto one answer shows there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibration.metrics import brier_loss, level_absolute_error, level_spearman_score
from eval.decisions.runner import run_tasks, run_through_spec
from eval.decisions.tasks import TASKS
from eval.evidence.rows import RECORDS, load_rows, raw_probabilities, rows_arrays
from readers.engines.base import Engine
from readers.prompt import PROMPT_VERSION, prompt_layout
from service.pipeline.prior import PriorCorrection

QUESTION_TYPES = ("noul", "choice", "score")
NOUL_LIFT_MARGIN = 0.02
"""How far below the best mean lift a yes/no candidate may be and still be chosen by its Brier score."""
PRIOR_SETTINGS = {"raw": raw_probabilities, "prior": lambda row: row["probabilities"]}
"""The two reads of each row: the model's own, and with the content-free prior divided out."""


def layout_dir(out: Path, version: str) -> Path:
    return out / version.replace("/", "-")


async def run_dev_reads(
    engine: Engine,
    out: Path,
    *,
    prompt_versions: Sequence[str],
    tasks: Sequence[str] = tuple(TASKS),
    limit: int | None = None,
    concurrency: int = 4,
) -> dict:
    """Read every layout's dev run (resumable), then :func:`dev_reads_report` over them."""
    for version in prompt_versions:
        prompt_layout(version)  # an unknown layout is refused before anything is read
    for version in prompt_versions:
        await run_tasks(
            engine,
            layout_dir(out, version),
            tasks=tasks,
            limit=limit,
            concurrency=concurrency,
            prompt_version=version,
            prior_correction=PriorCorrection.ALL,
            split="dev",
            reversed_order=False,
        )
    return dev_reads_report(out, prompt_versions)


def task_figures(rows: list[dict]) -> dict:
    """Per prior setting: accuracy, Brier score, answer counts and, for a score, MAE of the
    expected level and Spearman correlation."""
    ok = [row for row in rows if row["status"] == "ok" and row["variant"] == "original"]
    task = TASKS[ok[0]["task"]]
    figures = {"n": len(ok), "majority": Counter(r["gold"] for r in ok).most_common(1)[0][1] / len(ok)}
    for setting, probabilities_of in PRIOR_SETTINGS.items():
        p, y = rows_arrays(ok, probabilities_of)
        chosen = p.argmax(axis=1)
        entry = {
            "accuracy": float(np.mean(chosen == y)),
            "brier": brier_loss(p, y),
            "predicted": np.bincount(chosen, minlength=p.shape[1]).tolist(),
        }
        if task.question_type == "score":
            entry["mae"] = level_absolute_error(p, y)
            entry["spearman"] = level_spearman_score(p, y)
        figures[setting] = entry
    return figures


def dev_reads_report(out: Path, prompt_versions: Sequence[str], current: str = PROMPT_VERSION) -> dict:
    """The figures of every layout's dev run under ``out`` and the reads the rule picks (module docstring)."""
    layouts = {}
    candidates = []  # (question type, layout, prior setting, lift, brier)
    for version in prompt_versions:
        rows = load_rows(layout_dir(out, version) / RECORDS)
        tasks = [task for task in TASKS if any(row["task"] == task for row in rows)]
        figures = {task: task_figures([row for row in rows if row["task"] == task]) for task in tasks}
        by_type = {}
        for question_type in QUESTION_TYPES:
            typed = [task for task in tasks if TASKS[task].question_type == question_type]
            if not typed:
                continue
            by_type[question_type] = {"tasks": typed, "lift": {}, "brier": {}}
            for setting in PRIOR_SETTINGS:
                lift = float(
                    np.mean([figures[t][setting]["accuracy"] - figures[t]["majority"] for t in typed])
                )
                brier = float(np.mean([figures[t][setting]["brier"] for t in typed]))
                by_type[question_type]["lift"][setting] = lift
                by_type[question_type]["brier"][setting] = brier
                if prompt_layout(version).shares_state:
                    candidates.append((question_type, version, setting, lift, brier))
        layouts[version] = {
            "tasks": figures,
            "types": by_type,
            "candidate": prompt_layout(version).shares_state,
        }
    chosen = {}
    for question_type in QUESTION_TYPES:
        mine = [c for c in candidates if c[0] == question_type]
        if mine:
            chosen[question_type] = choose(mine, question_type, current)
    return {
        "rule": __doc__.split("The rule, fixed before a run (docs/reads.md):")[1]
        .split("Reported beside")[0]
        .strip(),
        "current": current,
        "layouts": layouts,
        "chosen": chosen,
    }


def choose(
    candidates: Sequence[tuple[str, str, str, float, float]], question_type: str, current: str
) -> dict:
    """The candidate rule 2 picks among ``candidates`` of one question type, each (question type,
    layout, prior setting, mean lift, mean Brier), with the rule it was picked by."""
    # Brier to 4 places: the same reads in two runs differ by batch-padding noise (~1e-7).
    if question_type == "noul":
        best = max(round(c[3], 6) for c in candidates)
        near = [c for c in candidates if round(c[3], 6) >= round(best - NOUL_LIFT_MARGIN, 6)]
        pick = min(near, key=lambda c: (round(c[4], 4), -round(c[3], 6), c[1] != current, c[2] != "raw"))
        rule = f"lowest Brier within {NOUL_LIFT_MARGIN * 100:g} points of the best lift"
    else:
        pick = max(
            candidates, key=lambda c: (round(c[3], 6), -round(c[4], 4), c[1] == current, c[2] == "raw")
        )
        rule = "highest lift"
    _, version, setting, lift, brier = pick
    return {"layout": version, "prior": setting == "prior", "lift": lift, "brier": brier,
            "beats_majority": lift > 0, "rule": rule}  # fmt: skip


def dev_reads_table(report: dict) -> str:
    """Per layout, task and prior setting: accuracy and Brier (score tasks: MAE, Spearman); the per-type lifts; the choice."""
    lines = [
        "| layout | task | type | n | majority | accuracy raw / prior | Brier raw / prior | answers raw / prior | MAE raw / prior | Spearman raw / prior |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for version, layout in report["layouts"].items():
        for task, f in layout["tasks"].items():
            raw, prior = f["raw"], f["prior"]
            score = TASKS[task].question_type == "score"
            lines.append(
                f"| {version} | {task} | {TASKS[task].question_type} | {f['n']} | {f['majority']:.1%} | "
                f"{raw['accuracy']:.1%} / {prior['accuracy']:.1%} | {raw['brier']:.3f} / {prior['brier']:.3f} | "
                f"{raw['predicted']} / {prior['predicted']} | "
                + (
                    f"{raw['mae']:.2f} / {prior['mae']:.2f} | {raw['spearman']:.2f} / {prior['spearman']:.2f} |"
                    if score
                    else "— | — |"
                )
            )
    lines += [
        "",
        "| layout | candidate | " + " | ".join(f"{t}: lift raw / prior" for t in QUESTION_TYPES) + " |",
        "|---|---|" + "---|" * len(QUESTION_TYPES),
    ]
    for version, layout in report["layouts"].items():
        cells = []
        for question_type in QUESTION_TYPES:
            entry = layout["types"].get(question_type)
            cells.append(
                "—" if entry is None else f"{entry['lift']['raw']:+.1%} / {entry['lift']['prior']:+.1%}"
            )
        lines.append(
            f"| {version} | {'yes' if layout['candidate'] else 'no (question first)'} | {' | '.join(cells)} |"
        )
    lines.append("")
    for question_type, c in report["chosen"].items():
        lines.append(
            f"chosen for {question_type}: {c['layout']}, {'prior divided out' if c['prior'] else 'raw'} "
            f"(lift {c['lift']:+.1%}, Brier {c['brier']:.3f}{'' if c['beats_majority'] else '; not above the majority rate'}), "
            f"by {c['rule']}"
        )
    return "\n".join(lines) + "\n"


async def evaluate_dev_reads(
    engine_spec: str, out: Path, *, engine_url: str | None = None, model: str | None = None, **options
) -> dict:
    """Open the engine ``engine_spec`` names (``model``: an embedded model's name) and :func:`run_dev_reads` through it."""
    return await run_through_spec(
        run_dev_reads, engine_spec, out, engine_options={"engine_url": engine_url, "model": model}, **options
    )
