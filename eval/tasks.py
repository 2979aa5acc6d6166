"""The four shipped tasks as Jev questions, with gold answers named as options.

Each task is one question asked of every record's text. Choice tasks also run with the option order
reversed (the ``reversed`` variant): a reader that depends on option position shows it there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

SAMPLES_PACKAGE = "eval.data"


@dataclass(frozen=True)
class Task:
    name: str
    question_type: str  # "choice" | "noul"
    instructions: str
    options: dict[str, str | None]  # option (gold answer name) → description; noul: {"true": …, "false": …}

    def question(self, *, reversed_options: bool = False) -> dict[str, Any]:
        """The Jev question for this task (choice options optionally in reverse order)."""
        if self.question_type == "noul":
            return {"type": "noul", "instructions": self.instructions, "criteria": dict(self.options)}
        items = list(self.options.items())
        if reversed_options:
            items.reverse()
        return {"type": "choice", "instructions": self.instructions, "criteria": dict(items)}

    def read_job(
        self, record: Record, variant: str = "original"
    ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """(record row base, Jev request, question name) for ``eval.evidence``: the record's text as
        state, this task's question as ``answer``."""
        base = {
            "id": record.id,
            "task": self.name,
            "variant": variant,
            "gold": record.gold,
            "options": list(self.options),
        }
        return (
            base,
            {
                "state": record.text,
                "questions": {"answer": self.question(reversed_options=variant == "reversed")},
            },
            "answer",
        )

    @property
    def variants(self) -> tuple[str, ...]:
        return ("original",) if self.question_type == "noul" else ("original", "reversed")


TASKS: dict[str, Task] = {
    task.name: task
    for task in [
        Task(
            "sst2",
            "choice",
            "What is the sentiment of this movie review?",
            {"negative": None, "positive": None},
        ),
        Task(
            "ag_news",
            "choice",
            "What is the topic of this news article?",
            {
                "World": "world news and politics",
                "Sports": "sports",
                "Business": "business and economy",
                "Sci/Tech": "science and technology",
            },
        ),
        Task(
            "emotion",
            "choice",
            "Which emotion does the writer express?",
            {"sadness": None, "joy": None, "love": None, "anger": None, "fear": None, "surprise": None},
        ),
        Task(
            "irony",
            "noul",
            "Is this tweet ironic?",
            {"true": "the tweet is ironic", "false": "the tweet is not ironic"},
        ),
    ]
}


@dataclass(frozen=True)
class Record:
    id: str
    task: str
    text: str
    gold: str


def load_sample(task: str) -> list[Record]:
    """The shipped sample of ``task`` (300 class-stratified records), in file order."""
    text = resources.files(SAMPLES_PACKAGE).joinpath(f"{task}.jsonl").read_text(encoding="utf-8")
    return [Record(**json.loads(line)) for line in text.splitlines() if line]


def spread(records: Sequence, limit: int | None) -> list:
    """``limit`` records spread evenly over the sample (the files are in upstream row order)."""
    if limit is None or limit >= len(records):
        return list(records)
    step = len(records) / limit
    return [records[int(i * step)] for i in range(limit)]
