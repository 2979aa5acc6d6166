"""``decide eval tasks``: read the shipped tasks through an engine and write the evidence.

A run directory holds ``records.jsonl.gz`` (one line per record and variant, written sorted when the
reads end; timings apart in ``records.timings.jsonl.gz``, ``eval.evidence.rows``)
and ``manifest.json`` (what produced them; status ``started`` until the run ends). Scorers read only
these files. A run is resumable: records already written are skipped, and a directory holding
another model's (or revision's, or data's) results is refused. Before the full run, a 5-record smoke
gate must pass, so a misconfigured engine fails in seconds, not after an hour.

An engine error on one record is written as ``status: "error"`` with its reason: such a record is
reported on its own line by the scorer, never scored as wrong or dropped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from eval.decisions.tasks import TASKS, Record, Split, Task, load_sample, spread
from eval.evidence.manifest import MANIFEST, Images, RunRefused, check_directory, run_manifest, write_json
from eval.evidence.rows import RECORDS, RecordWriter, read_row
from readers.engines.base import Engine
from readers.prompt import PROMPT_VERSION, LabelStyle, prompt_layout
from readers.reader import Reader
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION, OptionPriors, PriorCorrection

SMOKE_RECORDS = 5
T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    task: Task
    record: Record
    variant: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.task.name, self.record.id, self.variant)

    def as_read(self) -> tuple[dict[str, Any], dict[str, Any], str]:
        return self.task.read_job(self.record, self.variant)


def plan(
    tasks: Sequence[str], limit: int | None, *, split: Split = "test", reversed_order: bool = True
) -> list[Job]:
    """Every (record, variant) of the tasks' ``split``, in a fixed order; ``limit`` records per task;
    without ``reversed_order``, the original option order only."""
    jobs = []
    for name in tasks:
        task = TASKS[name]
        records = spread(task.records(split), limit)
        variants = task.variants if reversed_order else ("original",)
        jobs += [Job(task, record, variant) for variant in variants for record in records]
    return jobs


async def run_tasks(
    engine: Engine,
    out: Path,
    *,
    tasks: Sequence[str] = tuple(TASKS),
    limit: int | None = None,
    concurrency: int = 4,
    images: Images | None = None,
    seed: int = 0,
    args_passed: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    engine_log: str | None = None,
    label_styles: Sequence[str] | None = None,
    prompt_version: str = PROMPT_VERSION,
    prior_correction: PriorCorrection = DEFAULT_PRIOR_CORRECTION,
    split: Split = "test",
    reversed_order: bool = True,
) -> dict:
    """Run (or resume) the evidence for ``tasks`` into ``out``; returns the final manifest.
    ``label_styles``: the reader's label-style preference order (default: the layout's);
    ``prompt_version``: the layout to read under (an earlier one only to compare layouts);
    ``prior_correction``: which questions' answers get the content-free prior, as ``decide serve``'s
    option (rows record the answer and, in ``reading.raw_probabilities``, the model's own read);
    ``split``: the shipped test samples or the dev records defaults are chosen on
    (``eval.decisions.tasks``); ``reversed_order``: also read choice tasks with their options reversed."""
    out.mkdir(parents=True, exist_ok=True)
    prior_correction = PriorCorrection(prior_correction)
    args = {"tasks": list(tasks), "limit": limit, "concurrency": concurrency, "seed": seed}
    if split != "test" or not reversed_order:  # the keys old manifests lack mean test, both orders
        args |= {"split": split, "reversed_order": reversed_order}
    styles = None if label_styles is None else [LabelStyle(style) for style in label_styles]
    reader = Reader(engine, label_styles=styles, layout=prompt_layout(prompt_version))
    priors = None if prior_correction is PriorCorrection.OFF else OptionPriors(prior_correction)
    args["floor_offset"] = reader.floor_offset
    args["label_styles"] = [style.value for style in reader.label_styles]
    args["prior_correction"] = prior_correction.value
    manifest = run_manifest(
        "tasks",
        engines={"run": engine},
        args=args,
        images=images,
        status="started",
        prompt_version=prompt_version,
    )
    manifest["args_passed"] = args_passed or {}
    if engine_log is not None:
        from eval.capacity.kv_log import read_engine_log

        manifest.update(read_engine_log(engine_log))
    check_directory(out, manifest)
    previous_wall_s = (
        json.loads((out / MANIFEST).read_text()).get("wall_s", 0.0) if (out / MANIFEST).is_file() else 0.0
    )
    jobs = plan(tasks, limit, split=split, reversed_order=reversed_order)
    started = time.monotonic()
    async with RecordWriter(out / RECORDS) as sink:
        if not sink.done:
            await smoke_gate(
                reader, jobs[:SMOKE_RECORDS]
            )  # reads only: a correction cannot make a read informative
        write_json(out / MANIFEST, manifest)
        finished = sum(job.key in sink.done for job in jobs)

        def tick() -> None:
            nonlocal finished
            finished += 1
            if progress:
                progress(finished, len(jobs))

        await sink.read_all(
            reader, (job.as_read() for job in jobs), concurrency=concurrency, progress=tick, priors=priors
        )
    manifest["status"] = "success"
    manifest["records"] = len(jobs)
    manifest["wall_s"] = previous_wall_s + time.monotonic() - started  # summed over resumed sessions
    write_json(out / MANIFEST, manifest)
    return manifest


async def smoke_gate(reader: Reader, jobs: Sequence[Job]) -> None:
    """The first records must read cleanly before the full run starts."""
    for job in jobs:
        row = await read_row(reader, *job.as_read())
        if row["status"] != "ok":
            raise RunRefused(f"smoke gate failed on {job.record.id}: {row['error']['message']}")
        if not row["reading"]["informative"]:
            raise RunRefused(f"smoke gate: no label came back for {job.record.id}; check the engine's top-k")


async def evaluate_tasks(
    engine_spec: str,
    out: Path,
    *,
    engine_url: str | None = None,
    top_k: int | None = None,
    latency: bool = True,
    model: str | None = None,
    chat_template: str | None = None,
    **options: Any,
) -> dict:
    """Open the engine ``engine_spec`` names (``model``: an embedded model's name, ``chat_template``: jinja
    text replacing its template), :func:`run_tasks` into ``out`` and, with ``latency``,
    :func:`measure_latency`; returns the run's manifest."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(
        engine_spec, top_k=top_k, engine_url=engine_url, model=model, chat_template=chat_template
    ) as engine:
        manifest = await run_tasks(engine, out, **options)
        if latency:
            await measure_latency(engine, out)
    return manifest


async def run_through_spec(
    run: Callable[..., Awaitable[T]],
    engine_spec: str,
    out: Path,
    *,
    engine_options: dict[str, Any],
    **options: Any,
) -> T:
    """Open the engine ``engine_spec`` names (``engine_options``: what :func:`readers.engines.open_engine_spec`
    takes besides the spec), ``run(engine, out, **options)`` through it, close the engine; ``run``'s result."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(engine_spec, **engine_options) as engine:
        return await run(engine, out, **options)


async def measure_latency(engine: Engine, out: Path, *, requests_c1: int = 30, requests_c8: int = 64) -> dict:
    """Latency at concurrency 1 and decisions/s at concurrency 8 on SST-2 records, into latency.json."""
    import uuid

    from eval.capacity.load import machine_info, run_load
    from service.pipeline.decide import decide
    from service.protocol import SystemOneRequest

    reader = Reader(engine)
    task = TASKS["sst2"]
    bodies = [
        SystemOneRequest.model_validate({"state": r.text, "questions": {"answer": task.question()}})
        for r in load_sample("sst2")
    ]

    async def send(i: int) -> bool:
        await decide(bodies[i % len(bodies)], reader, request_id=uuid.uuid4().hex)
        return True

    c1 = await run_load(send, requests=requests_c1, concurrency=1)
    c8 = await run_load(send, requests=requests_c8, concurrency=8)
    result = {"machine": machine_info(), "task": "sst2", "c1": c1.as_json(), "c8": c8.as_json()}
    write_json(out / "latency.json", result)
    return result
