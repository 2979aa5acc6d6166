"""The answer slot's hidden state of every record a few-shot curve scores (round 3's ``probe`` mode).

A committed run holds each record's reads, not the model's hidden state (576 numbers per read for
SmolLM2-135M: ~2 MB per task as JSON text). The probe's curve reads each record again through the service's
path (``service.pipeline.reads.read_planned``, the layout the run was read under) on the embedded
engine, and checks that the read equals the committed one (``MAX_READ_DRIFT``): the features then
belong to the same prompt as the reads the curve fits on. They are kept as float32 files under the
opendecide cache (:func:`features_path`, in ``readers.embedded.default_cache_dir()``), one per (model revision, run, task), named by the sha256 of the
run's records file, so a changed run is read again; the curve's JSON names each file's sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from eval.decisions.tasks import TASKS
from eval.evidence.manifest import MANIFEST
from eval.evidence.rows import RECORDS, load_rows, raw_probabilities
from readers.embedded import default_cache_dir
from readers.engines.base import Engine
from readers.prompt import content_text, prompt_layout
from readers.reader import Reader

MAX_READ_DRIFT = 1e-4
"""Largest difference, per option probability, between a record's read now and the committed one
(the committed runs' float32 reads agree with today's to ~5e-6, evidence/few-shot/dev-check)."""


def run_digest(run: Path) -> str:
    return hashlib.sha256((Path(run) / RECORDS).read_bytes()).hexdigest()


def features_path(revision: str, run: Path, task: str) -> Path:
    safe = revision.replace("/", "_").replace(":", "_")
    return default_cache_dir() / "features" / safe / f"{run_digest(run)[:16]}-{task}.npy"


async def read_features(engine: Engine, rows: Sequence[dict], split: str, prompt_version: str) -> np.ndarray:
    """The hidden state at the answer slot of each row's question about its record's text (``split``'s
    records), read as the service reads it under ``prompt_version``; ValueError where a read differs
    from the row's by more than ``MAX_READ_DRIFT``."""
    from service.pipeline.reads import read_planned, to_read
    from service.protocol import SystemOneRequest

    if not engine.capabilities.features:
        raise ValueError(f"the {engine.kind} engine returns no hidden states: a probe needs the local engine")
    reader = Reader(engine, layout=prompt_layout(prompt_version))
    records = {(task, r.id): r for task in {row["task"] for row in rows} for r in TASKS[task].records(split)}
    gate = asyncio.Semaphore(4)

    async def one(row: dict) -> list[float]:
        _, body, name = TASKS[row["task"]].read_job(records[(row["task"], row["id"])], row["variant"])
        request = SystemOneRequest.model_validate(body)
        async with gate:
            (reading,) = await read_planned(
                reader, [to_read(request.questions[name])], content_text(request.state)
            )
        # In option order on both sides; sorted, so the check holds whatever names the row keys by.
        now = sorted(reading.label_probabilities.probabilities)
        committed = sorted(raw_probabilities(row).values())
        drift = max(abs(a - b) for a, b in zip(now, committed, strict=True))
        if drift > MAX_READ_DRIFT:
            raise ValueError(
                f"{row['task']} {row['id']}: the read differs from the committed row by {drift:.2g}"
            )
        if reading.features is None:
            raise ValueError(f"{row['task']} {row['id']}: the engine returned no hidden state")
        return list(reading.features)

    return np.asarray(await asyncio.gather(*(one(row) for row in rows)), dtype=np.float32)


async def run_features(runs: Mapping[str, Path], split: str) -> dict[str, tuple[np.ndarray, str]]:
    """Per task of ``runs`` (question type → run directory, as the few-shot curve takes them): the
    hidden states of its curve rows (``few_shot.task_rows``), read under the run's prompt version on
    the embedded engine (float32), or from the cache; with each file's sha256."""
    from eval.decisions.few_shot import task_rows
    from readers.engines import open_engine

    out: dict[str, tuple[np.ndarray, str]] = {}
    engine = None
    try:
        for question_type, run in runs.items():
            rows = load_rows(Path(run))
            version = json.loads((Path(run) / MANIFEST).read_text())["prompt_version"]
            for task in sorted({r["task"] for r in rows}):
                if TASKS[task].question_type != question_type:
                    continue
                mine = task_rows(rows, task)
                engine = engine or await open_engine("local")
                path = features_path(engine.info.revision, Path(run), task)
                if not path.is_file():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    np.save(path, await read_features(engine, mine, split, version))
                features = np.load(path)
                if len(features) != len(mine):
                    raise ValueError(f"{path}: {len(features)} rows of features for {len(mine)} reads")
                out[task] = (features, hashlib.sha256(path.read_bytes()).hexdigest())
    finally:
        if engine is not None:
            await engine.aclose()
    return out
