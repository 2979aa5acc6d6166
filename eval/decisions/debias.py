"""``decide eval debias``: order-debiased reads (``x_debias: "rotate"``) against plain reads.

For each setting (``none``; ``all`` = k is the option count; ``reverse`` = ``rotate_reverse`` with
every order; an integer k, capped at the option count) the choice tasks are read in their original and reversed option order into
``OUT/<setting>/records.jsonl.gz`` (the ``decide eval tasks`` row format, so ``score_task`` scores it),
through the service's own path (``decide``). The engine is wrapped to count its ``read_many`` calls
(engine calls) and the reads in them. ``debias.json`` / ``debias.md`` give per setting and task:
accuracy (original and reversed), reversed-order changes, mean rotation agreement, reads and engine
calls per question. Resumable per setting, like the task runner.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.decisions.runner import plan, run_through_spec
from eval.decisions.score import score_task
from eval.evidence.manifest import MANIFEST, check_directory, run_manifest, write_json
from eval.evidence.rows import RECORDS, RecordWriter, load_rows
from readers.engines.base import Engine, ReadRequest
from readers.prompt import LabelStyle
from readers.reader import Reader

CHOICE_TASKS = ("sst2", "ag_news", "emotion")
SETTINGS = ("none", "all", "2")


class CountingEngine:
    """An engine that counts its ``read_many`` calls and the reads in them; everything else is the wrapped engine's."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.calls = 0
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def read_many(self, requests: Sequence[ReadRequest]):
        self.calls += 1
        self.reads += len(requests)
        return await self._engine.read_many(requests)


def question_options(setting: str, option_count: int) -> dict[str, Any]:
    """The question's read options for ``setting``: ``none``; ``all`` (``rotate``, every rotation);
    ``reverse`` (``rotate_reverse``, every rotation of the order and of its reverse); or a count k of
    ``rotate`` rotations, capped at the option count."""
    if setting == "none":
        return {}
    if setting == "all":
        return {"x_debias": "rotate"}
    if setting == "reverse":
        return {"x_debias": "rotate_reverse"}
    k = int(setting) if setting.isdigit() else 0
    if k < 2:
        raise ValueError(f"a rotation setting is none, all, reverse or an integer ≥ 2, got {setting!r}")
    return {"x_debias": "rotate", "x_rotations": min(k, option_count)}


async def run_debias(
    engine: Engine,
    out: Path,
    *,
    tasks: Sequence[str] = CHOICE_TASKS,
    limit: int | None = None,
    settings: Sequence[str] = SETTINGS,
    concurrency: int = 4,
    args_passed: dict | None = None,
    label_styles: Sequence[LabelStyle] = (LabelStyle.CODES,),
) -> dict:
    """Read every setting into ``out/<setting>`` and write ``debias.json`` and ``debias.md``; returns the report.

    Letter codes by default: since decide-prompt/3 they are the prompts that list the options in the
    asked order, so the only ones rotations change (named options are one prompt in every order and
    are read once whatever ``x_debias`` asks)."""
    for setting in settings:
        question_options(setting, 2)  # refuse a bad setting before reading anything
    counting = CountingEngine(engine)
    reader = Reader(counting, label_styles=tuple(label_styles))
    args = {
        "tasks": list(tasks),
        "limit": limit,
        "settings": list(settings),
        "concurrency": concurrency,
        "label_styles": [str(style) for style in label_styles],
    }
    report: dict[str, Any] = {"settings": {}}
    for setting in settings:
        directory = out / setting
        directory.mkdir(parents=True, exist_ok=True)
        manifest = run_manifest(
            "debias", engines={"run": engine}, args={**args, "setting": setting}, status="started"
        )
        manifest["args_passed"] = args_passed or {}
        check_directory(directory, manifest)
        previous = json.loads((directory / MANIFEST).read_text()) if (directory / MANIFEST).is_file() else {}
        write_json(directory / MANIFEST, manifest)
        counts, started = {}, time.monotonic()
        async with RecordWriter(directory / RECORDS) as sink:
            for task in tasks:  # one task at a time, so engine calls and reads are counted per task
                todo = [job for job in plan([task], limit) if job.key not in sink.done]
                calls, reads = counting.calls, counting.reads
                await sink.read_all(
                    reader, (_with_options(job.as_read(), setting) for job in todo), concurrency=concurrency
                )
                counts[task] = {
                    "questions": len(todo),
                    "calls": counting.calls - calls,
                    "reads": counting.reads - reads,
                }
                if not todo:  # all read in an earlier session: keep that session's counts
                    counts[task] = previous.get("engine_calls", {}).get(task, counts[task])
        manifest.update(
            status="success",
            records=len(plan(tasks, limit)),
            wall_s=previous.get("wall_s", 0.0) + time.monotonic() - started,
        )
        manifest["engine_calls"] = counts
        write_json(directory / MANIFEST, manifest)
        report["settings"][setting] = _score_setting(directory, manifest)
    report["engine"] = run_manifest("debias", engines={"run": engine}, args=args)["engines"]["run"]
    write_json(out / "debias.json", report)
    (out / "debias.md").write_text(debias_table(report))
    return report


def _with_options(job: tuple[dict, dict, str], setting: str) -> tuple[dict, dict, str]:
    base, body, name = job
    question = body["questions"][name]
    question = {**question, **question_options(setting, len(question["criteria"]))}
    return {**base, "setting": setting}, {**body, "questions": {name: question}}, name


def _score_setting(directory: Path, manifest: dict) -> dict:
    rows = load_rows(directory / RECORDS, timings=True)  # score_task reports median latency
    result: dict[str, Any] = {"wall_s": manifest["wall_s"], "tasks": {}}
    for task in manifest["args"]["tasks"]:
        counts = manifest["engine_calls"][task]
        mine = [row for row in rows if row["task"] == task]
        scored = score_task(mine)
        reversed_ok = [row for row in mine if row["variant"] == "reversed" and row["status"] == "ok"]
        ok = [row for row in mine if row["status"] == "ok"]
        result["tasks"][task] = {
            "n": scored["n"],
            "errors": scored["errors"],
            "accuracy": scored.get("accuracy"),
            "accuracy_reversed": sum(row["predicted"] == row["gold"] for row in reversed_ok)
            / len(reversed_ok)
            if reversed_ok
            else None,
            "reversed_changes": scored.get("reversed_changes"),
            "reversed_pairs": scored.get("reversed_pairs"),
            "rotations": max((row["reading"]["rotations"] for row in ok), default=None),
            "rotation_agreement_mean": _mean(
                [
                    row["reading"]["rotation_agreement"]
                    for row in ok
                    if row["reading"]["rotation_agreement"] is not None
                ]
            ),
            "engine_calls_per_question": counts["calls"] / counts["questions"]
            if counts["questions"]
            else None,
            "reads_per_question": counts["reads"] / counts["questions"] if counts["questions"] else None,
        }
    return result


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def debias_table(report: dict) -> str:
    engine = report["engine"]
    lines = [
        (
            f"Engine {engine['kind']} ({engine['read_mode']}), model {engine['model']} @ {engine['revision']}. "
            "Reversed-order changes: records whose predicted option differs between the original and reversed option order."
        ),
        "",
        "| setting | task | rotations k | n | accuracy original | accuracy reversed | reversed-order changes | mean rotation agreement | reads / question | engine calls / question |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, entry in report["settings"].items():
        for task, s in entry["tasks"].items():
            changes = (
                f"{s['reversed_changes']} of {s['reversed_pairs']} ({s['reversed_changes'] / s['reversed_pairs']:.1%})"
                if s.get("reversed_pairs")
                else "—"
            )
            agreement = (
                f"{s['rotation_agreement_mean']:.3f}" if s["rotation_agreement_mean"] is not None else "—"
            )
            acc = f"{s['accuracy']:.1%}" if s["accuracy"] is not None else "—"
            acc_r = f"{s['accuracy_reversed']:.1%}" if s["accuracy_reversed"] is not None else "—"
            lines.append(
                f"| {setting} | {task} | {s['rotations']} | {s['n']} | {acc} | {acc_r} | {changes} | {agreement} | "
                f"{_number(s['reads_per_question'])} | {_number(s['engine_calls_per_question'])} |"
            )
    return "\n".join(lines) + "\n"


async def evaluate_debias(
    engine_spec: str, out: Path, *, engine_url: str | None = None, top_k: int | None = None, **options: Any
) -> dict:
    """Open the engine ``engine_spec`` names and :func:`run_debias` into ``out``."""
    return await run_through_spec(
        run_debias, engine_spec, out, engine_options={"top_k": top_k, "engine_url": engine_url}, **options
    )
