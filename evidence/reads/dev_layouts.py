"""Layouts chosen on development records, measured on the shipped samples afterwards.

Choosing a prompt by the records that then measure it fits the prompt to its test sample. This probe
reads candidate layouts on *development* records: drawn from the same upstream files as the shipped
samples (class-stratified, another seed) with every shipped row left out, so no record read here is
one the evals score. The candidates differ from decide-prompt/4 in how a question's text is laid out
(options named, descriptions placed, the answer format), never per task, and in which questions get
the label-free prior correction (the question's option prior read on content-free states divided
out, ``service.prior``): none, choice questions (options the caller named), or every question.
Selection rule, fixed before the run: the highest mean over the four tasks of (accuracy − the
task's majority rate).

Needs ``../shared/data`` (the upstream files). Run:
PYTHONPATH=. python evidence/reads/dev_layouts.py ../shared/data 200 [layout …] > evidence/reads/dev-layouts-200.txt
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from calibration.bias import apply_prior
from eval.samples import READERS, SAMPLE_SIZE, SEED, stratified_rows
from eval.tasks import TASKS
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from readers.prompt import ANSWER_LEAD, STATE_SEPARATOR, SYSTEM_PROMPT, PromptLayout, PromptText, QuestionSpec, _or_list, canonical_order, build_prompt
from readers.reader import Reader
from service.prior import measure_prior
from service.protocol import SystemOneRequest

DEV_SEED = SEED + 1


def dev_records(data: Path, task: str, size: int) -> list[tuple[str, str]]:
    """(text, gold) for ``size`` stratified rows of the upstream file that the shipped sample does not hold."""
    rows = READERS[task](data)
    shipped = set(stratified_rows([label for _, label in rows], SAMPLE_SIZE, SEED))
    rest = [row for row in range(len(rows)) if row not in shipped]
    picked = stratified_rows([rows[row][1] for row in rest], size, DEV_SEED)
    return [(rows[rest[i]][0].strip(), rows[rest[i]][1]) for i in picked]


def candidate(name: str) -> PromptLayout:
    def build(question: QuestionSpec, state: str, labels: tuple[str, ...], style) -> PromptText:
        named = question.question_type == "noul" or (question.question_type == "choice" and style.names_options)
        if name == "decide-prompt/4" or not named:
            return build_prompt(question, state, labels, style)
        order = canonical_order(labels)
        pairs = [(labels[i], question.descriptions[i]) for i in order]
        described = [(label, text) for label, text in pairs if text]
        lines = [f"Question: {question.instructions}"] if question.instructions else []
        names = tuple(label for label, _ in pairs)
        if name == "answer with one of the names":
            lines += [f"{label}: {text}" for label, text in described]
            lines.append(f"Answer with one of: {_or_list(names)}.")
        elif name == "names listed, then descriptions":
            lines.append("Options: " + ", ".join(names))
            lines += [f"{label}: {text}" for label, text in described]
            lines.append("Answer with one word.")
        elif name == "dashed options with descriptions":
            lines.append("Options:")
            lines += [f"- {label} ({text})" if text else f"- {label}" for label, text in pairs]
            lines.append("Answer with one of the options.")
        elif name == "no answer format":
            lines += [f"{label}: {text}" for label, text in described]
        elif name == "descriptions, then the question":
            lines = [f"{label}: {text}" for label, text in described] + lines + ["Answer with one word."]
        elif name == "descriptions as meanings":
            lines += [f'"{label}" means {text}.' for label, text in described]
            lines.append("Answer with one word.")
        else:
            raise ValueError(name)
        return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines), labels, style)

    return PromptLayout(f"dev: {name}", build, answer_lead=ANSWER_LEAD)


CANDIDATES = (
    "decide-prompt/4",
    "answer with one of the names",
    "names listed, then descriptions",
    "dashed options with descriptions",
    "no answer format",
    "descriptions, then the question",
    "descriptions as meanings",
)


def question_of(task) -> QuestionSpec:
    """The task's question as the service parses it."""
    return SystemOneRequest.model_validate({"state": "", "questions": {"q": task.question()}}).questions["q"].to_spec()


POLICIES = ("no prior", "prior on choice", "prior on every question")


async def main(data: Path, size: int, layouts: tuple[str, ...]) -> None:
    tasks = [TASKS[name] for name in ("sst2", "ag_news", "emotion", "irony")]
    dev = {task.name: dev_records(data, task.name, size) for task in tasks}
    majority = {name: max(Counter(g for _, g in rows).values()) / len(rows) for name, rows in dev.items()}
    engine = LocalEngine(prepare_embedded_model())
    print(f"development records: {size} per task, stratified, seed {DEV_SEED}, shipped rows excluded; majority rates "
          + ", ".join(f"{k} {v:.1%}" for k, v in majority.items()))
    print("| layout | prior correction | " + " | ".join(t.name for t in tasks) + " | mean over majority | predicted (ag_news, emotion) | s |")
    print("|---|---|" + "---|" * (len(tasks) + 3))
    try:
        for name in layouts:
            reader = Reader(engine, layout=candidate(name))
            started = time.monotonic()
            accuracy: dict[str, dict[str, float]] = {policy: {} for policy in POLICIES}
            counts: dict[str, dict[str, list[int]]] = {policy: {} for policy in POLICIES}
            for task in tasks:
                question = question_of(task)
                readings = await asyncio.gather(*(reader.read(question, text) for text, _ in dev[task.name]))
                raw = np.array([r.label_probabilities.probabilities for r in readings])
                prior = await measure_prior(reader, question)
                corrected = apply_prior(raw, prior.prior) if prior is not None else raw  # None: no read returned every label
                gold_index = np.array([question.options.index(gold) for _, gold in dev[task.name]])
                for policy in POLICIES:
                    applies = policy == "prior on every question" or (policy == "prior on choice" and question.question_type == "choice")
                    p = corrected if applies else raw
                    accuracy[policy][task.name] = float(np.mean(p.argmax(axis=1) == gold_index))
                    counts[policy][task.name] = np.bincount(p.argmax(axis=1), minlength=len(question.options)).tolist()
            seconds = time.monotonic() - started
            for policy in POLICIES:
                lift = np.mean([accuracy[policy][t] - majority[t] for t in accuracy[policy]])
                cells = " | ".join(f"{accuracy[policy][t.name]:.1%}" for t in tasks)
                print(f"| {name} | {policy} | {cells} | {lift:+.1%} | {counts[policy]['ag_news']} {counts[policy]['emotion']} | {seconds:.0f} |", flush=True)
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 200, tuple(sys.argv[3:]) or CANDIDATES))
