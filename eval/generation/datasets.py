"""The generation datasets shipped in ``eval/data`` (GSM8K test, BFCL v3 simple), checked by sha256.

Each file is the upstream file byte for byte; ``eval/data/generation.json`` holds its sha256, upstream
and licence (``eval/data/GENERATION-DATA.md`` for people). A file whose sha256 differs is refused
(:class:`DataMismatch`) unless ``allow_mismatch`` is given; the loaded dataset then says which files
differed, and a run records it in its manifest.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

GenerationTask = Literal["gsm8k", "bfcl_simple"]
GENERATION_TASKS: tuple[GenerationTask, ...] = ("gsm8k", "bfcl_simple")
MANIFEST = "generation.json"


class DataMismatch(ValueError):
    """A shipped file's sha256 is not the one its manifest records."""


@dataclass(frozen=True)
class Problem:
    """One record: ``prompt`` the chat messages, ``gold`` the GSM8K answer text or the BFCL possible
    answer, ``functions`` the BFCL function descriptions (empty for GSM8K)."""

    id: str
    messages: list[dict[str, str]]
    gold: Any
    functions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Dataset:
    task: GenerationTask
    problems: list[Problem]
    sha256: dict[str, str]
    """File → sha256 of the bytes read."""
    mismatched: list[str]
    """Files whose sha256 differed from the manifest's (read only with ``allow_mismatch``)."""


def manifest() -> dict[str, Any]:
    return json.loads(resources.files("eval.data").joinpath(MANIFEST).read_text(encoding="utf-8"))


def _read_checked(
    task: GenerationTask, allow_mismatch: bool
) -> tuple[dict[str, bytes], dict[str, str], list[str]]:
    expected = manifest()["datasets"][task]["files"]
    payloads, digests, mismatched = {}, {}, []
    for name, sha in expected.items():
        payload = resources.files("eval.data").joinpath(name).read_bytes()
        digests[name] = hashlib.sha256(payload).hexdigest()
        if digests[name] != sha:
            if not allow_mismatch:
                raise DataMismatch(
                    f"eval/data/{name} has sha256 {digests[name]}, not {sha}; pass --allow-mismatch to read it anyway"
                )
            mismatched.append(name)
        payloads[name] = payload
    return payloads, digests, mismatched


def _json_lines(payload: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in payload.decode("utf-8").splitlines() if line.strip()]


def load_dataset(task: GenerationTask, *, allow_mismatch: bool = False) -> Dataset:
    """Every problem of ``task`` in upstream order."""
    payloads, digests, mismatched = _read_checked(task, allow_mismatch)
    if task == "gsm8k":
        rows = _json_lines(payloads["gsm8k/test.jsonl"])
        # Ids are the 0-based line of the upstream file, as the study's record ids are.
        problems = [
            Problem(f"gsm8k-{i}", [{"role": "user", "content": row["question"]}], row["answer"])
            for i, row in enumerate(rows)
        ]
    elif task == "bfcl_simple":
        questions = _json_lines(payloads["bfcl/BFCL_v3_simple.json"])
        answers = {
            row["id"]: row["ground_truth"]
            for row in _json_lines(payloads["bfcl/possible_answer/BFCL_v3_simple.json"])
        }
        # Simple records hold one turn of messages and one function (BFCL's "simple" category).
        problems = [
            Problem(row["id"], row["question"][0], answers[row["id"]], row["function"]) for row in questions
        ]
    else:
        raise ValueError(f"unknown generation task {task!r}; known: {', '.join(GENERATION_TASKS)}")
    return Dataset(task, problems, digests, mismatched)


def subset(problems: list[Problem], limit: int | None, seed: int) -> list[Problem]:
    """The first ``limit`` problems of a ``seed``-ed shuffle, in upstream order (all without a limit).
    The same (limit, seed) draws the same ids on every machine, so two runs pair record by record, and a
    larger limit holds every problem of a smaller one."""
    if limit is None or limit >= len(problems):
        return list(problems)
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    chosen = sorted(order[:limit])
    return [problems[i] for i in chosen]
