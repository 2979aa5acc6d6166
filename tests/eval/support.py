"""Helpers more than one eval test module builds its inputs with (plain functions; fixtures stay in conftest)."""

from __future__ import annotations

import shutil
from pathlib import Path

from eval.evidence.manifest import MANIFEST, write_json
from eval.evidence.rows import RECORDS, write_rows

# Recorded metadata of the surveyed models, so the survey runs offline.
SURVEY_METADATA = Path(__file__).resolve().parents[1] / "fixtures" / "survey-metadata.json"

# The settings a `decide eval generate` run records, as stored_run writes them.
GENERATION_SETTINGS = {"task": "gsm8k", "max_tokens": 2048, "limit": None, "seed": 0,
                       "chat_template_kwargs": {"enable_thinking": False}, "tools_in_prompt": False}  # fmt: skip


def copy_run(source: Path, tmp_path: Path, name: str = "run") -> Path:
    """A copy of a run directory under ``tmp_path``, for a test that changes it."""
    return Path(shutil.copytree(source, tmp_path / name))


def fake_irony(data: Path, rows: int = 620) -> None:
    """An upstream irony split of ``rows`` tweets, two in five ironic, in TweetEval's file layout."""
    (data / "irony").mkdir(parents=True)
    (data / "irony" / "test_text.txt").write_text("".join(f"tweet {row} \n" for row in range(rows)))
    (data / "irony" / "test_labels.txt").write_text("".join(f"{int(row % 5 < 2)}\n" for row in range(rows)))


def stored_run(path, model, outcomes, *, status="ok", **args):
    """A run directory as ``decide eval generate`` writes it, with ``outcomes`` (right/wrong by problem)."""
    path.mkdir()
    ids = [f"gsm8k-{i}" for i in range(len(outcomes))]
    write_json(path / MANIFEST, {"run": "generate", "server": {"model": model}, "data_sha256": {"gsm8k/test.jsonl": "x"},
                                 "args": GENERATION_SETTINGS | args, "record_ids": ids})  # fmt: skip
    rows = [{"task": "gsm8k", "id": i, "variant": "greedy", "status": status, "correct": c, "truncated": False}
            for i, c in zip(ids, outcomes)]  # fmt: skip
    write_rows(path / RECORDS, rows)
    return path
