"""``decide eval label-styles``: accuracy and reversed-order changes per label style on the shipped tasks.

Each style set is a reader preference order (``STYLE_SETS``; ``default`` is the layout's own); each
runs, under each prompt layout asked for, as ``decide eval tasks`` does (:func:`eval.decisions.runner.run_tasks`,
resumable) into ``<out>/<prompt version>/<style set>/`` (``decide-prompt/3`` → ``decide-prompt-3``),
so one run can compare layouts as well as styles. The table reads only those record rows: per
task, the answers' accuracy (read as ``decide serve`` answers, the run's ``--prior-correction``
included) on the original and reversed option order with 95% Wilson intervals, how many records
change their predicted option when the order is reversed, and the raw read's accuracy (the
model's own probabilities, before any correction) beside it. Score tasks also get the answers' level
figures on the original order: the MAE of the expected level against the gold level and their Spearman
correlation (``calibration.metrics``; "—" for other tasks, and for a Spearman a constant side leaves
undefined).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from calibration.metrics import level_absolute_error, level_spearman_score
from eval.decisions.runner import run_tasks, run_through_spec
from eval.decisions.score import wilson_interval
from eval.decisions.tasks import TASKS
from eval.evidence.manifest import MANIFEST, write_json
from eval.evidence.rows import RECORDS, load_rows, raw_probabilities, rows_arrays
from readers.engines.base import Engine
from readers.prompt import PROMPT_VERSION, prompt_layout
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION, PriorCorrection

STYLE_SETS: dict[str, tuple[str, ...] | None] = {
    "default": None,  # the layout's own preference order (PromptLayout.label_styles)
    "words": ("words", "codes"),  # decide-prompt/2's reads: one-token names, else one-token codes
    "first_tokens": ("words", "first_tokens", "codes"),
    "trie": ("words", "trie", "codes"),
    "codes": ("codes", "code_trie"),
}


def run_dir(out: Path, prompt_version: str, style_set: str) -> Path:
    return out / prompt_version.replace("/", "-") / style_set


async def run_label_styles(
    engine: Engine,
    out: Path,
    *,
    style_sets: Sequence[str] = tuple(STYLE_SETS),
    prompt_versions: Sequence[str] = (PROMPT_VERSION,),
    tasks: Sequence[str] = tuple(TASKS),
    limit: int | None = None,
    concurrency: int = 4,
    prior_correction: PriorCorrection = DEFAULT_PRIOR_CORRECTION,
) -> list[dict]:
    """Run every style set under every layout and return (and write to ``out/label-styles.json``)
    the rows; ``prior_correction`` as ``decide serve``'s (accuracy is the answers')."""
    unknown = [name for name in style_sets if name not in STYLE_SETS]
    if unknown:
        raise ValueError(f"unknown style set(s) {unknown}; known: {', '.join(STYLE_SETS)}")
    for version in prompt_versions:
        prompt_layout(version)  # refuse an unknown version before any reading
    runs = [(version, name) for version in prompt_versions for name in style_sets]
    for version, name in runs:
        await run_tasks(
            engine, run_dir(out, version, name), tasks=tasks, limit=limit, concurrency=concurrency, label_styles=STYLE_SETS[name], prompt_version=version,
            prior_correction=prior_correction,
        )  # fmt: skip
    rows = [row for version, name in runs for row in style_rows(run_dir(out, version, name), name)]
    write_json(out / "label-styles.json", rows)
    return rows


def style_rows(run: Path, name: str) -> list[dict]:
    """One row per task of one style set's run: the answers' accuracy (what a caller gets) and, for
    the original order, the model's own read's (``raw``; equal where no correction applied)."""
    rows = []
    manifest = json.loads((run / MANIFEST).read_text())
    prompt_version = manifest.get("prompt_version")
    prior_correction = manifest["args"].get(
        "prior_correction", "off"
    )  # runs from before the option answered raw
    by_task: dict[str, list[dict]] = {}
    for row in load_rows(run / RECORDS):
        by_task.setdefault(row["task"], []).append(row)
    for task, records in by_task.items():
        ok = [row for row in records if row["status"] == "ok"]
        variants = {
            variant: {row["id"]: row for row in ok if row["variant"] == variant}
            for variant in TASKS[task].variants
        }
        result = {
            "style_set": name,
            "task": task,
            "prompt_version": prompt_version,
            "prior_correction": prior_correction,
            "errors": len(records) - len(ok),
        }
        for variant, rows_by_id in variants.items():
            correct = sum(row["predicted"] == row["gold"] for row in rows_by_id.values())
            n = len(rows_by_id)
            result[variant] = {
                "n": n,
                "correct": correct,
                "accuracy": correct / n if n else None,
                "interval": wilson_interval(correct, n) if n else None,
            }
        original = variants["original"].values()
        raw_correct = sum(
            max(raw := raw_probabilities(row), key=raw.__getitem__) == row["gold"] for row in original
        )
        result["raw"] = {
            "n": len(original),
            "correct": raw_correct,
            "accuracy": raw_correct / len(original) if original else None,
        }
        result["levels"] = level_figures(list(original)) if TASKS[task].question_type == "score" else None
        result["corrected"] = sum(
            row["reading"].get("prior_correction") is not None for row in ok
        )  # absent before the option
        if "reversed" in variants:
            both = variants["original"].keys() & variants["reversed"].keys()
            result["reversed_changes"] = sum(
                variants["original"][i]["predicted"] != variants["reversed"][i]["predicted"] for i in both
            )
            result["paired"] = len(both)
        result["label_styles_used"] = dict(Counter(row["reading"]["label_style"] for row in ok))
        rows.append(result)
    return rows


def level_figures(rows: list[dict]) -> dict | None:
    """The answers' expected-level MAE and Spearman (None where undefined) over a score task's rows;
    None without rows. Columns are the levels in order (``eval.decisions.score.ordinal_scores``)."""
    if not rows:
        return None
    p, y = rows_arrays(rows)
    spearman = level_spearman_score(p, y)
    return {
        "mae_expected_level": level_absolute_error(p, y),
        "spearman": None if math.isnan(spearman) else spearman,
    }


def label_styles_table(rows: Sequence[dict]) -> str:
    lines = [
        "| style set | prompt | prior correction | task | n | accuracy original (95%) | accuracy reversed (95%) | reversed changes | raw read, original | MAE, expected level | Spearman | label styles used |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(result: dict | None) -> str:
        if not result or not result["n"]:
            return "—"
        lo, hi = result["interval"]
        return f"{result['accuracy']:.1%} ({lo:.1%}–{hi:.1%})"

    for row in rows:
        changes = (
            f"{row['reversed_changes']} of {row['paired']} ({row['reversed_changes'] / row['paired']:.0%})"
            if row.get("paired")
            else "—"
        )
        used = ", ".join(f"{style} {count}" for style, count in row["label_styles_used"].items())
        raw = f"{row['raw']['accuracy']:.1%}" if row["raw"]["n"] else "—"
        found = row.get("levels")  # absent in rows written before score tasks
        mae = f"{found['mae_expected_level']:.3f}" if found else "—"
        spearman = f"{found['spearman']:.3f}" if found and found["spearman"] is not None else "—"
        lines.append(
            f"| {row['style_set']} | {row['prompt_version']} | {row['prior_correction']} | {row['task']} | {row['original']['n']} | {cell(row['original'])} "
            f"| {cell(row.get('reversed'))} | {changes} | {raw} | {mae} | {spearman} | {used} |"
        )
    return "\n".join(lines) + "\n"


async def evaluate_label_styles(
    engine_spec: str, out: Path, *, engine_url: str | None = None, top_k: int | None = None, **options
) -> list[dict]:
    """Open the engine ``engine_spec`` names and :func:`run_label_styles` into ``out``."""
    return await run_through_spec(
        run_label_styles,
        engine_spec,
        out,
        engine_options={"top_k": top_k, "engine_url": engine_url},
        **options,
    )
