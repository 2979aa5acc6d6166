"""Where a question's option descriptions go (scratch probe, kept as evidence for docs/reads.md).

Reads the AG News question (the only shipped task whose options have descriptions) on spread
records under layouts that differ from decide-prompt/3 only in how the descriptions are shown,
with the default label styles, and prints accuracy and how often each option is predicted, raw and
after the label-free prior corrections: the content-free prior (content-free states) and the state
prior (the mean of the other records' reads, leave-one-out: what a ``state_prior`` calibration fitted
on unlabelled states of the task divides out). Layouts are ``PromptLayout``s handed
to the reader, the same way eval reads earlier prompt versions.

Run: PYTHONPATH=. python evidence/reads/description_layouts.py 60 > evidence/reads/description-layouts-60.txt
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np

from calibration.bias import CONTENT_FREE_STATES, apply_prior, option_prior
from eval.tasks import TASKS, load_sample, spread
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from readers.prompt import CURRENT_LAYOUT, STATE_SEPARATOR, SYSTEM_PROMPT, PromptLayout, PromptText, QuestionSpec, build_question_first, canonical_order
from readers.reader import Reader


def described(layout: str):
    def build(question: QuestionSpec, state: str, labels: tuple[str, ...], style) -> PromptText:
        if question.question_type != "choice" or not style.names_options:
            return CURRENT_LAYOUT.build(question, state, labels, style)
        if layout == "question-first (decide-prompt/1 text)":
            return build_question_first(question, state, labels, style)
        pairs = [(labels[i], question.descriptions[i]) for i in canonical_order(labels) if question.descriptions[i]]
        lines = [f"Question: {question.instructions}"]
        after: list[str] = []
        if layout == "shipped (decide-prompt/3)":
            lines += [f"{name}: {text}" for name, text in pairs]
        elif layout == "without descriptions":
            pass
        elif layout == "before the question":
            lines = [f"{name}: {text}" for name, text in pairs] + lines
        elif layout == "inline":
            lines[0] += " " + "; ".join(f"{name} means {text}" for name, text in pairs) + "."
        elif layout == "in parentheses":
            lines[0] += " (" + ", ".join(f"{name}: {text}" for name, text in pairs) + ")"
        elif layout == "dashed list":
            lines += ["Options:"] + [f"- {name} ({text})" for name, text in pairs]
        elif layout == "descriptions only":
            lines.append("Topics: " + "; ".join(text for _, text in pairs) + ".")
        elif layout == "skip descriptions equal to the name":
            lines += [f"{name}: {text}" for name, text in pairs if name.casefold() != text.casefold()]
        elif layout == "after the answer format":
            after = [f"({name}: {text})" for name, text in pairs]
        elif layout == "decide-prompt/1 listing after the state":
            lines += ["Options: " + ", ".join(name for name, _ in pairs)] + [f"- {name}: {text}" for name, text in pairs]
            lines.append("Reply with exactly one option.")
            return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines), labels, style)
        lines.append("Answer with one word.")
        return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines + after), labels, style)

    return PromptLayout(f"probe: {layout}", build)


LAYOUTS = (
    "shipped (decide-prompt/3)",
    "without descriptions",
    "before the question",
    "inline",
    "in parentheses",
    "dashed list",
    "descriptions only",
    "skip descriptions equal to the name",
    "after the answer format",
    "decide-prompt/1 listing after the state",
    "question-first (decide-prompt/1 text)",
)


async def main(n: int) -> None:
    task = TASKS["ag_news"]
    records = spread(load_sample("ag_news"), n)
    criteria = task.question()["criteria"]
    question = QuestionSpec("choice", task.instructions, tuple(criteria), tuple(criteria.values()))
    gold = np.array([question.options.index(record.gold) for record in records])
    engine = LocalEngine(prepare_embedded_model())
    try:
        print(f"ag_news, {n} spread records; options {list(question.options)}; predicted counts in that order")
        print("| layout | accuracy | content-free prior | state prior (leave-one-out) | predicted per option |")
        print("|---|---|---|---|---|")
        for name in LAYOUTS:
            reader = Reader(engine, layout=described(name))
            readings = await asyncio.gather(*(reader.read(question, record.text) for record in records))
            p = np.array([r.label_probabilities.probabilities for r in readings])
            free = [await reader.read(question, state) for state in CONTENT_FREE_STATES]
            prior = option_prior([r.label_probabilities.probabilities for r in free])
            corrected = np.array([apply_prior(row, prior) for row in p])
            others = (p.sum(axis=0) - p) / (len(p) - 1)  # each record's prior from the other records
            state_corrected = p / others
            counts = np.bincount(p.argmax(axis=1), minlength=len(question.options)).tolist()
            print(f"| {name} | {np.mean(p.argmax(axis=1) == gold):.1%} | {np.mean(corrected.argmax(axis=1) == gold):.1%} | {np.mean(state_corrected.argmax(axis=1) == gold):.1%} | {counts} |", flush=True)
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 60))
