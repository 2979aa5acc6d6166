"""``decide eval dev-layouts``: prompt layouts compared on development records, never the shipped ones.

Choosing a layout by the records that then measure it fits the layout to its test sample. This reads
each named layout of the registry (``readers.prompt.PROMPT_LAYOUTS``, the layouts the reader really
builds) on *development* records: drawn from the same upstream files as the shipped samples
(class-stratified, another seed) with every shipped row left out, so no record read here is one the
evals score. Each layout is scored under three prior-correction policies (the question's option
prior, read on content-free states, divided out; ``service.pipeline.prior``): none, choice questions, every
question. Selection rule, fixed before a run: the highest mean over the tasks of (accuracy − the
task's majority rate).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibration.bias import apply_prior
from eval.samples import READERS, SAMPLE_SIZE, SEED, stratified_rows
from eval.tasks import TASKS
from readers.engines.base import Engine
from readers.prompt import prompt_layout
from readers.reader import Reader
from service.pipeline.prior import PriorCorrection, measure_prior
from service.protocol import SystemOneRequest

DEV_SEED = SEED + 1
# The policies as the tables name them: decide serve's --prior-correction off, choice, all.
POLICIES = {
    "no prior": PriorCorrection.OFF,
    "prior on choice": PriorCorrection.CHOICE,
    "prior on every question": PriorCorrection.ALL,
}


def dev_records(data: Path, task: str, size: int) -> list[tuple[str, str]]:
    """(text, gold) of ``size`` stratified rows of the task's upstream file that the shipped sample does not hold."""
    rows = READERS[task](data)
    shipped = set(stratified_rows([label for _, label in rows], SAMPLE_SIZE, SEED))
    rest = [row for row in range(len(rows)) if row not in shipped]
    picked = stratified_rows([rows[row][1] for row in rest], size, DEV_SEED)
    return [(rows[rest[i]][0].strip(), rows[rest[i]][1]) for i in picked]


async def dev_layouts(
    engine: Engine, data: Path, *, size: int, prompt_versions: Sequence[str], tasks: Sequence[str]
) -> dict:
    """Per layout and policy: accuracy per task, the mean lift over the majority rate, the predicted
    counts per option, the raw reads' median label mass per task and the layout's seconds; plus the majority rates and the
    choice by the selection rule."""
    layouts = [prompt_layout(version) for version in prompt_versions]  # an unknown version is refused first
    dev = {task: dev_records(data, task, size) for task in tasks}
    majority = {
        task: max(Counter(gold for _, gold in rows).values()) / len(rows) for task, rows in dev.items()
    }
    results = []
    for layout in layouts:
        reader = Reader(engine, layout=layout)
        started = time.monotonic()
        accuracy: dict[str, dict[str, float]] = {policy: {} for policy in POLICIES}
        predicted: dict[str, dict[str, list[int]]] = {policy: {} for policy in POLICIES}
        label_mass: dict[str, float | None] = {}
        for task in tasks:
            request = {"state": "", "questions": {"q": TASKS[task].question()}}
            question = SystemOneRequest.model_validate(request).questions["q"].to_spec()
            readings = await asyncio.gather(*(reader.read(question, text) for text, _ in dev[task]))
            raw = np.array([reading.label_probabilities.probabilities for reading in readings])
            masses = [reading.label_probabilities.label_mass for reading in readings]
            # how much of the next token's probability the labels hold (None where the engine normalised over them)
            label_mass[task] = None if None in masses else float(np.median(masses))
            prior = await measure_prior(reader, question)
            # None: no content-free read returned every label, so there is nothing sound to divide out
            corrected = apply_prior(raw, prior.prior) if prior is not None else raw
            gold = np.array([question.options.index(answer) for _, answer in dev[task]])
            for policy in POLICIES:
                covered = POLICIES[policy].covers(question.question_type)
                chosen = (corrected if covered else raw).argmax(axis=1)
                accuracy[policy][task] = float(np.mean(chosen == gold))
                predicted[policy][task] = np.bincount(chosen, minlength=len(question.options)).tolist()
        seconds = time.monotonic() - started
        for policy in POLICIES:
            lift = float(np.mean([accuracy[policy][task] - majority[task] for task in tasks]))
            results.append(
                {"layout": layout.version, "policy": policy, "accuracy": accuracy[policy], "lift": lift,
                 "predicted": predicted[policy], "label_mass": label_mass, "seconds": seconds}
            )  # fmt: skip
    best = max(results, key=lambda result: result["lift"])
    return {"size": size, "seed": DEV_SEED, "tasks": list(tasks), "majority": majority, "results": results,
            "chosen": {"layout": best["layout"], "policy": best["policy"]}}  # fmt: skip


def dev_layouts_table(report: dict) -> str:
    tasks = report["tasks"]
    # answer counts where more than two options make a collapse onto one of them worth seeing
    choice = [task for task in tasks if len(TASKS[task].question()["criteria"]) > 2]
    lines = [
        f"development records: {report['size']} per task, stratified, seed {report['seed']}, shipped rows excluded; "
        "majority rates " + ", ".join(f"{task} {rate:.1%}" for task, rate in report["majority"].items()),
        f"| layout | prior correction | {' | '.join(tasks)} | mean over majority | predicted"
        + (f" ({', '.join(choice)})" if choice else "")
        + " | s |",
        "|---|---|" + "---|" * (len(tasks) + 3),
    ]
    for result in report["results"]:
        cells = " | ".join(f"{result['accuracy'][task]:.1%}" for task in tasks)
        counts = " ".join(str(result["predicted"][task]) for task in choice)
        lines.append(
            f"| {result['layout']} | {result['policy']} | {cells} | {result['lift']:+.1%} | {counts} | {result['seconds']:.0f} |"
        )
    lines.append(f"chosen by the rule: {report['chosen']['layout']}, {report['chosen']['policy']}")
    return "\n".join(lines) + "\n"


async def evaluate_dev_layouts(
    engine_spec: str, data: Path, *, engine_url: str | None = None, **options
) -> dict:
    """Open the engine ``engine_spec`` names and :func:`dev_layouts` through it."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(engine_spec, engine_url=engine_url) as engine:
        return await dev_layouts(engine, data, **options)
