"""``decide eval tasks``: read the shipped tasks through an engine and write the evidence.

A run directory holds ``records.jsonl`` (one line per record and variant, appended as reads finish)
and ``manifest.json`` (what produced them; status ``started`` until the run ends). Scorers read only
these files. A run is resumable: records already written are skipped, and a directory holding
another model's (or revision's, or data's) results is refused. Before the full run, a 5-record smoke
gate must pass, so a misconfigured engine fails in seconds, not after an hour.

An engine error on one record is written as ``status: "error"`` with its reason: such a record is
reported on its own line by the scorer, never scored as wrong or dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.manifest import run_manifest, write_json
from eval.reads import read_records
from eval.tasks import TASKS, Record, Task, load_sample, spread
from readers.engines.base import Engine
from readers.errors import DecideError
from readers.reader import Reader

RECORDS = "records.jsonl"
MANIFEST = "manifest.json"
SMOKE_RECORDS = 5


class RunRefused(RuntimeError):
    """The directory holds results this run must not mix with."""


@dataclass(frozen=True)
class Job:
    task: Task
    record: Record
    variant: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.task.name, self.record.id, self.variant)


def plan(tasks: Sequence[str], limit: int | None) -> list[Job]:
    """Every (record, variant) of the tasks, in a fixed order; ``limit`` records per task."""
    jobs = []
    for name in tasks:
        task = TASKS[name]
        records = spread(load_sample(name), limit)
        jobs += [Job(task, record, variant) for variant in task.variants for record in records]
    return jobs


def row_key(row: dict) -> tuple[str, str, str]:
    """Records are keyed by task (suite: subset), id and variant: suite subsets may share ids."""
    return (row["task"], row["id"], row["variant"])


def done_keys(path: Path) -> set[tuple[str, str, str]]:
    """Records already read successfully (failed ones are retried on resume)."""
    if not path.is_file():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("status") == "ok":
            keys.add(row_key(row))
    return keys


def drop_torn_tail(path: Path) -> None:
    """A killed writer can leave a last line without its newline: cut it, so the next append starts
    on a line of its own (the record it held is redone)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def check_directory(out: Path, manifest: dict) -> None:
    """Refuse to mix: same model, revision, data and prompt, or a fresh directory."""
    existing_path = out / MANIFEST
    if not existing_path.is_file():
        return
    existing = json.loads(existing_path.read_text())
    mine, theirs = manifest["engines"]["run"], existing["engines"]["run"]
    for field, a, b in [
        ("model", mine["model"], theirs["model"]),
        ("revision", mine["revision"], theirs["revision"]),
        ("read mode", mine["read_mode"], theirs["read_mode"]),
        ("top-k", mine["top_k"], theirs["top_k"]),
        ("prompt version", manifest["prompt_version"], existing["prompt_version"]),
        ("data", manifest["data_sha256"], existing["data_sha256"]),
        ("tasks", manifest["args"].get("tasks"), existing["args"].get("tasks")),
        ("limit", manifest["args"].get("limit"), existing["args"].get("limit")),
    ]:
        if a != b:
            raise RunRefused(f"{out} holds results with {field} {b!r}, not {a!r}: use another --out")


def _row(job: Job, read=None, error: DecideError | None = None) -> dict[str, Any]:
    base = {"id": job.record.id, "task": job.task.name, "variant": job.variant, "gold": job.record.gold, "options": list(job.task.options)}
    if error is not None:
        return {**base, "status": "error", "error": {"type": error.error_type, "message": error.message}}
    return {**base, "status": "ok", **{k: v for k, v in read.as_json().items() if k not in base}}


async def run_tasks(
    engine: Engine,
    out: Path,
    *,
    tasks: Sequence[str] = tuple(TASKS),
    limit: int | None = None,
    concurrency: int = 4,
    image_digest: str | None = None,
    seed: int = 0,
    args_passed: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    engine_log: str | None = None,
) -> dict:
    """Run (or resume) the evidence for ``tasks`` into ``out``; returns the final manifest."""
    out.mkdir(parents=True, exist_ok=True)
    args = {"tasks": list(tasks), "limit": limit, "concurrency": concurrency, "image_digest": image_digest, "seed": seed}
    reader = Reader(engine)
    args["floor_offset"] = reader.floor_offset
    manifest = run_manifest("tasks", engines={"run": engine}, args=args, status="started")
    manifest["args_passed"] = args_passed or {}
    manifest["image_digest"] = image_digest
    if engine_log is not None:
        from eval.kv_log import read_engine_log

        manifest.update(read_engine_log(engine_log))
    check_directory(out, manifest)
    previous_wall_s = json.loads((out / MANIFEST).read_text()).get("wall_s", 0.0) if (out / MANIFEST).is_file() else 0.0
    jobs = plan(tasks, limit)
    drop_torn_tail(out / RECORDS)
    done = done_keys(out / RECORDS)
    todo = [job for job in jobs if job.key not in done]
    if not done:
        await smoke_gate(reader, jobs[:SMOKE_RECORDS])
    write_json(out / MANIFEST, manifest)

    lock = asyncio.Lock()
    finished = len(jobs) - len(todo)
    started = time.monotonic()
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Job, sink) -> None:
        nonlocal finished
        async with gate:
            try:
                (read,) = await read_records(reader, job.task, [job.record], variant=job.variant, concurrency=1)
                row = _row(job, read)
            except DecideError as error:
                row = _row(job, error=error)
        async with lock:
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            finished += 1
            if progress:
                progress(finished, len(jobs))

    with (out / RECORDS).open("a", encoding="utf-8") as sink:
        await asyncio.gather(*(one(job, sink) for job in todo))
    manifest["status"] = "success"
    manifest["records"] = len(jobs)
    manifest["wall_s"] = previous_wall_s + time.monotonic() - started  # summed over resumed sessions
    write_json(out / MANIFEST, manifest)
    return manifest


async def smoke_gate(reader: Reader, jobs: Sequence[Job]) -> None:
    """The first records must read cleanly before the full run starts."""
    for job in jobs:
        try:
            (read,) = await read_records(reader, job.task, [job.record], variant=job.variant, concurrency=1)
        except DecideError as error:
            raise RunRefused(f"smoke gate failed on {job.record.id}: {error.message}") from None
        if not read.reading["informative"]:
            raise RunRefused(f"smoke gate: no label came back for {job.record.id}; check the engine's top-k")


async def measure_latency(engine: Engine, out: Path, *, requests_c1: int = 30, requests_c8: int = 64) -> dict:
    """Latency at concurrency 1 and decisions/s at concurrency 8 on SST-2 records, into latency.json."""
    import uuid

    from eval.load import machine_info, run_load
    from service.decide import decide
    from service.protocol import SystemOneRequest

    reader = Reader(engine)
    task = TASKS["sst2"]
    bodies = [SystemOneRequest.model_validate({"state": r.text, "questions": {"answer": task.question()}}) for r in load_sample("sst2")]

    async def send(i: int) -> bool:
        await decide(bodies[i % len(bodies)], reader, request_id=uuid.uuid4().hex)
        return True

    c1 = await run_load(send, requests=requests_c1, concurrency=1)
    c8 = await run_load(send, requests=requests_c8, concurrency=8)
    result = {"machine": machine_info(), "task": "sst2", "c1": c1.as_json(), "c8": c8.as_json()}
    write_json(out / "latency.json", result)
    return result
