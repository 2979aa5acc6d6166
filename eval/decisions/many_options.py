"""``decide eval many-options``: from how many options a choice question reads options-first, chosen on
development records by a rule fixed before the run.

decide-prompt/7 lists a choice question's described options after the state, so the list is
computed under the caller's state and again under each content-free prior state; decide-prompt/8
(``readers.prompt.build_options_first``) puts the list before the state, where the question's reads
on every state share it. Moving the list can move answers, and the shipped tasks hold at most six
options, so this reads many-option questions built from the shipped **dev** records:

- ``ag_news``: its four topics with their shipped descriptions, plus described distractor topics
  (``AG_NEWS_DISTRACTORS``, the first ``n − 4`` in order);
- ``emotion``: its six emotions, each described ("the writer feels sad"), plus described distractor
  emotions (``EMOTION_DISTRACTORS``, the first ``n − 6``).

The gold answer is always one of the task's own options; the distractors are fixed lists written
before the run, the same for both layouts, so the comparison is paired record for record. Each
question is read at every option count of ``OPTION_COUNTS`` under both layouts, through the
reader, with the content-free prior divided out (the choice default, ``service.pipeline.prior``)
and the raw read kept beside it.

The rule, fixed before the run:

1. At each option count n, per layout: accuracy and Brier score of the served (prior-corrected)
   read, the mean over the two tasks.
2. Options-first is acceptable at n when its mean accuracy is not more than ``ACCURACY_MARGIN`` (2
   points, the margin the yes/no read rule allows, ``eval.decisions.dev_reads``) below /7's and its
   mean Brier score not more than ``BRIER_MARGIN`` (0.02) above /7's.
3. ``MANY_OPTIONS`` (``readers.prompt``) is the smallest count of ``OPTION_COUNTS`` at which
   options-first is acceptable there and at every larger count; where it is acceptable at none, or
   not at the largest, options-first is not adopted and the report says so. Below that count a
   choice question reads as under /7 (the shipped tasks, 2–6 options, unchanged).

The committed run reads 100 dev records per task, spread evenly over the 200 (for time on two
shared cores), the embedded SmolLM2-135M, exact reads:

    decide eval many-options --limit 100 --out evidence/reads/many-options

Reported beside the rule: raw accuracy, the tokens the engine computed per record (what the layout
is for), and each task's figures with Wilson intervals.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibration.bias import apply_prior
from calibration.metrics import brier_loss
from eval.decisions.score import wilson_interval
from eval.decisions.tasks import TASKS, spread
from readers.engines.base import Engine
from readers.prompt import QuestionSpec, prompt_layout
from readers.reader import Reader
from service.pipeline.prior import measure_prior

OPTION_COUNTS = (6, 12, 26)
LAYOUTS = ("decide-prompt/7", "decide-prompt/8")
ACCURACY_MARGIN = 0.02
BRIER_MARGIN = 0.02
EMOTION_DESCRIPTIONS = {
    "sadness": "the writer feels sad",
    "joy": "the writer feels joyful",
    "love": "the writer feels love",
    "anger": "the writer feels angry",
    "fear": "the writer feels afraid",
    "surprise": "the writer feels surprised",
}
AG_NEWS_DISTRACTORS = (
    ("Cooking", "recipes, food and cooking"),
    ("Gardening", "plants and gardens"),
    ("Fashion", "clothes and style"),
    ("Music", "songs, albums and concerts"),
    ("Movies", "films and cinema"),
    ("Travel", "holidays and tourism"),
    ("Religion", "faith and religion"),
    ("Weather", "weather forecasts"),
    ("Pets", "pets and animal care"),
    ("Parenting", "raising children"),
    ("Poetry", "poems and poetry"),
    ("Art", "painting and the visual arts"),
    ("History", "events of past centuries"),
    ("Education", "schools and teaching"),
    ("Celebrity", "celebrity gossip"),
    ("Fitness", "exercise and fitness"),
    ("Books", "books and literature"),
    ("Crafts", "knitting and handicrafts"),
    ("Astrology", "horoscopes and astrology"),
    ("Dating", "romance and dating"),
    ("Humor", "jokes and humor"),
    ("Theatre", "plays and theatre"),
)
EMOTION_DISTRACTORS = tuple(
    (name, f"the writer feels {feeling}")
    for name, feeling in (
        ("boredom", "bored"),
        ("pride", "proud"),
        ("shame", "ashamed"),
        ("guilt", "guilty"),
        ("envy", "envious"),
        ("disgust", "disgusted"),
        ("hope", "hopeful"),
        ("relief", "relieved"),
        ("curiosity", "curious"),
        ("confusion", "confused"),
        ("nostalgia", "nostalgic"),
        ("gratitude", "grateful"),
        ("loneliness", "lonely"),
        ("calm", "calm"),
        ("awe", "awed"),
        ("embarrassment", "embarrassed"),
        ("contempt", "contemptuous"),
        ("anticipation", "expectant"),
        ("amusement", "amused"),
        ("jealousy", "jealous"),
    )
)
STUDY_TASKS = {"ag_news": AG_NEWS_DISTRACTORS, "emotion": EMOTION_DISTRACTORS}


def many_option_question(task_name: str, n: int) -> QuestionSpec:
    """The task's question with ``n`` described options: its own (described), then distractors."""
    task = TASKS[task_name]
    own = {name: task.options[name] or EMOTION_DESCRIPTIONS[name] for name in task.options}
    extra = STUDY_TASKS[task_name][: n - len(own)]
    if len(own) + len(extra) != n:
        raise ValueError(f"{task_name} has no {n}-option question here")
    options = tuple(own) + tuple(name for name, _ in extra)
    descriptions = tuple(own.values()) + tuple(description for _, description in extra)
    return QuestionSpec("choice", task.instructions, options, descriptions)


async def read_layout(
    engine: Engine, version: str, task_name: str, n: int, limit: int | None, concurrency: int
) -> list[dict]:
    """Every dev record of the task's ``n``-option question under one layout: one row each."""
    reader = Reader(engine, layout=prompt_layout(version))
    question = many_option_question(task_name, n)
    prior = await measure_prior(reader, question)
    records = spread(TASKS[task_name].records("dev"), limit)
    gate = asyncio.Semaphore(concurrency)

    async def one(record) -> dict:
        async with gate:
            reading = await reader.read(question, record.text)
        raw = np.asarray(reading.label_probabilities.probabilities, dtype=float)
        served = apply_prior(raw, prior.prior) if prior is not None else raw
        return {
            "task": task_name,
            "options": n,
            "layout": version,
            "id": record.id,
            "gold": question.options.index(record.gold),
            "raw": raw.tolist(),
            "served": served.tolist(),
            "tokens_computed": reading.tokens_computed,
            "tokens_reused": reading.tokens_reused,
        }

    return list(await asyncio.gather(*(one(record) for record in records)))


def figures(rows: Sequence[dict], read: str) -> dict:
    p = np.asarray([row[read] for row in rows])
    y = np.asarray([row["gold"] for row in rows])
    right = int(np.sum(p.argmax(axis=1) == y))
    return {
        "accuracy": right / len(rows),
        "interval": wilson_interval(right, len(rows)),
        "brier": brier_loss(p, y),
    }


def many_options_report(rows: Sequence[dict]) -> dict:
    """Per option count and layout, the figures of each task and their means; the count the rule picks."""
    by_count = {}
    for n in OPTION_COUNTS:
        entry = {}
        for version in LAYOUTS:
            tasks = {}
            for task_name in STUDY_TASKS:
                cell = [
                    r for r in rows if r["options"] == n and r["layout"] == version and r["task"] == task_name
                ]
                if not cell:
                    continue
                tasks[task_name] = {
                    "n": len(cell),
                    "served": figures(cell, "served"),
                    "raw": figures(cell, "raw"),
                    "tokens_computed_median": float(np.median([r["tokens_computed"] or 0 for r in cell])),
                }
            if tasks:
                entry[version] = {
                    "tasks": tasks,
                    "accuracy": float(np.mean([t["served"]["accuracy"] for t in tasks.values()])),
                    "brier": float(np.mean([t["served"]["brier"] for t in tasks.values()])),
                }
        if len(entry) == len(LAYOUTS):
            old, new = (entry[v] for v in LAYOUTS)
            entry["acceptable"] = (
                new["accuracy"] >= old["accuracy"] - ACCURACY_MARGIN
                and new["brier"] <= old["brier"] + BRIER_MARGIN
            )
        by_count[n] = entry
    chosen = None
    for n in reversed(OPTION_COUNTS):
        if not by_count.get(n, {}).get("acceptable"):
            break
        chosen = n
    return {"by_count": by_count, "many_options": chosen}


def many_options_table(report: dict) -> str:
    lines = [
        "| options | task | /7 served accuracy (95% CI) | /8 served accuracy (95% CI) | /7 / /8 Brier | /7 / /8 raw accuracy | /7 / /8 tokens computed per record (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, entry in report["by_count"].items():
        if len(entry) < len(LAYOUTS):
            continue
        old, new = (entry[v] for v in LAYOUTS)
        for task_name in old["tasks"]:
            a, b = old["tasks"][task_name], new["tasks"][task_name]
            lines.append(
                f"| {n} | {task_name} | {a['served']['accuracy']:.1%} ({a['served']['interval'][0]:.1%}–"
                f"{a['served']['interval'][1]:.1%}) | {b['served']['accuracy']:.1%} "
                f"({b['served']['interval'][0]:.1%}–{b['served']['interval'][1]:.1%}) | "
                f"{a['served']['brier']:.3f} / {b['served']['brier']:.3f} | {a['raw']['accuracy']:.1%} / "
                f"{b['raw']['accuracy']:.1%} | {a['tokens_computed_median']:.0f} / {b['tokens_computed_median']:.0f} |"
            )
        lines.append(
            f"| {n} | **mean** | {old['accuracy']:.1%} | {new['accuracy']:.1%} | {old['brier']:.3f} / "
            f"{new['brier']:.3f} | | options-first acceptable: **{'yes' if entry['acceptable'] else 'no'}** |"
        )
    lines.append("")
    lines.append(f"MANY_OPTIONS by the rule: {report['many_options']}")
    return "\n".join(lines)


async def run_many_options(engine: Engine, out: Path, *, limit: int | None, concurrency: int = 4) -> dict:
    """Read every (option count, task, layout) cell into ``out/rows.jsonl`` (resumable per cell), then
    the report (``report.json``, ``report.md``)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    done = {(r["options"], r["task"], r["layout"]) for r in rows}
    for n in OPTION_COUNTS:
        for task_name in STUDY_TASKS:
            for version in LAYOUTS:
                if (n, task_name, version) in done:
                    continue
                cell = await read_layout(engine, version, task_name, n, limit, concurrency)
                with path.open("a") as sink:
                    sink.writelines(json.dumps(row) + "\n" for row in cell)
                rows += cell
    report = many_options_report(rows)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(many_options_table(report) + "\n")
    return report


async def evaluate_many_options(
    engine_spec: str, out: Path, *, limit: int | None, concurrency: int = 4
) -> dict:
    """Open the engine ``engine_spec`` names and :func:`run_many_options` on it."""
    from readers.engines import open_engine_spec

    engine = await open_engine_spec(engine_spec)
    try:
        return await run_many_options(engine, out, limit=limit, concurrency=concurrency)
    finally:
        await engine.aclose()
