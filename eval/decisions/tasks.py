"""The shipped tasks as Jev questions, with gold answers named as options.

Each task is one question asked of every record's text: three choice tasks, one yes/no task and two
score tasks (SST-5's five levels, and the same sentences on three). Choice tasks also run with the
option order reversed (the ``reversed`` variant): a reader that depends on option position shows it
there; a score's levels have one order.

Every task has three splits, all shipped in ``eval.data`` and disjoint: ``test`` (the sample the
evals report, ``<sample>.jsonl``), ``dev`` (``<sample>.dev.jsonl``: what read defaults are chosen on,
docs/reads.md) and ``fresh`` (``<sample>.fresh.jsonl``: kept unread until a rule written first
confirms on it, evidence/few-shot/round-5/rule.md). ``eval.decisions.samples`` builds them from the
upstream files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

SAMPLES_PACKAGE = "eval.data"
SPLITS = ("test", "dev", "fresh")
Split = Literal["test", "dev", "fresh"]


@dataclass(frozen=True)
class Task:
    name: str
    question_type: str  # "choice" | "noul" | "score"
    instructions: str
    options: dict[str, str | None]
    """Option (gold answer name) → description; noul: {"true": …, "false": …}; score: level ("0", "1",
    …) → the level's text, the question's criteria in order."""
    sample: str = ""
    """The sample file stem the records come from (default: the task's name)."""
    gold_map: Mapping[str, str] = field(default_factory=dict)
    """Upstream gold → this task's gold, where the task merges the sample's classes (empty: as is)."""

    def question(self, *, reversed_options: bool = False) -> dict[str, Any]:
        """The Jev question for this task (choice options optionally in reverse order)."""
        if self.question_type == "noul":
            return {"type": "noul", "instructions": self.instructions, "criteria": dict(self.options)}
        if self.question_type == "score":
            return {
                "type": "score",
                "instructions": self.instructions,
                "criteria": list(self.options.values()),
            }
        items = list(self.options.items())
        if reversed_options:
            items.reverse()
        return {"type": "choice", "instructions": self.instructions, "criteria": dict(items)}

    def read_job(
        self, record: Record, variant: str = "original"
    ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """(record row base, Jev request, question name) for ``eval.evidence.rows``: the record's text as
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
        return ("original", "reversed") if self.question_type == "choice" else ("original",)

    @property
    def sample_name(self) -> str:
        """The shipped sample this task's records come from."""
        return self.sample or self.name

    def records(self, split: Split = "test") -> list[Record]:
        """This task's records of ``split``: the sample's, with gold answers mapped where the task merges classes."""
        records = read_sample(self.sample_name, split)
        if not self.gold_map:
            return records
        return [Record(r.id, self.name, r.text, self.gold_map[r.gold]) for r in records]


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
        Task(
            "sst5",
            "score",
            "How positive is the sentiment of this movie review?",
            {"0": "very negative", "1": "negative", "2": "neutral", "3": "positive", "4": "very positive"},
        ),
        # The same sentences on three levels: SST-5's two negative and two positive levels merged.
        Task(
            "sst3",
            "score",
            "How positive is the sentiment of this movie review?",
            {"0": "negative", "1": "neutral", "2": "positive"},
            sample="sst5",
            gold_map={"0": "0", "1": "0", "2": "1", "3": "2", "4": "2"},
        ),
    ]
}


@dataclass(frozen=True)
class Record:
    id: str
    task: str
    text: str
    gold: str


def sample_file(sample: str, split: Split = "test") -> str:
    """The file name of a shipped sample's split."""
    if split not in SPLITS:
        raise ValueError(f"split is one of {', '.join(SPLITS)}, not {split!r}")
    return f"{sample}.jsonl" if split == "test" else f"{sample}.{split}.jsonl"


def read_sample(sample: str, split: Split = "test") -> list[Record]:
    """A shipped sample's records of ``split``, in file order: test holds 300 class-stratified
    records, dev 200 others, fresh up to 300 more (``eval.decisions.samples``)."""
    text = resources.files(SAMPLES_PACKAGE).joinpath(sample_file(sample, split)).read_text(encoding="utf-8")
    return [Record(**json.loads(line)) for line in text.splitlines() if line]


def load_sample(task: str, split: Split = "test") -> list[Record]:
    """The records of ``task`` in ``split`` (``Task.records``); a name that is only a sample's, its records."""
    return TASKS[task].records(split) if task in TASKS else read_sample(task, split)


def spread(records: Sequence, limit: int | None) -> list:
    """``limit`` records spread evenly over the sample (the files are in upstream row order)."""
    if limit is None or limit >= len(records):
        return list(records)
    step = len(records) / limit
    return [records[int(i * step)] for i in range(limit)]
