"""Per-record evidence: one row format, one resumable writer, one loader, one rows → arrays.

A **record row** is one JSON line per (task, record id, variant): ``id``, ``task`` (the suite's
subset), ``variant``, ``gold`` (the true answer, an option name), ``options`` (option order),
``status`` (``ok`` or ``error``), then for ``ok`` rows ``probabilities`` (by option: the answer's,
what a caller gets; the model's own read is ``reading.raw_probabilities``, and the two differ only
where a correction applied, ``reading.prior_correction`` or ``reading.calibration``), ``reading``
(the answer's reading), ``latency_ms`` and ``predicted`` (from ``probabilities``), or for ``error`` rows
``error: {type, message}``. Callers may add fields (the suite adds ``subset``, ``question_type``,
``family``). ``decide eval tasks``, ``suite`` and ``agree`` write rows with :class:`RecordWriter`;
every scorer reads them with :func:`load_rows`.

On disk a record file is gzip-compressed JSON lines (``records.jsonl.gz``; ``a.jsonl.gz`` and
``b.jsonl.gz`` for ``agree``), written whole when its writer closes, deterministically: one row per
key, sorted by key, keys in the order the row was built, gzip level 9 with no file name and mtime 0.
What differs on every read of the same records — the decision id and the timings
(:data:`TIMING_FIELDS`) — is kept apart in ``<name>.timings.jsonl.gz``, one line per key, so a rerun
with the same code and model rewrites only that file. ``load_rows(..., timings=True)`` joins them
back for the figures that report latency. Files from before this format convert with
:func:`pack_plain` (``decide eval pack``); plain JSON lines are not read.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

from readers.errors import DecideError
from readers.reader import Reader
from service.pipeline.decide import decide
from service.pipeline.prior import OptionPriors
from service.protocol import ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneRequest

RECORDS = "records.jsonl.gz"
ROWS_SUFFIX = ".jsonl.gz"
TIMINGS_SUFFIX = ".timings.jsonl.gz"
# Fields of a row that differ on every read of the same record (a random id, wall-clock timings):
# top-level ones, then those inside ``reading``. They live in the timings file, keyed by row_key.
TIMING_FIELDS = ("latency_ms",)
READING_TIMING_FIELDS = ("decision_id", "engine_latency_ms", "queued_ms", "latency_ms")
GZIP_LEVEL = 9

RecordRow = dict[str, Any]
Key = tuple[str, str, str]


def row_key(row: RecordRow) -> Key:
    """Rows are keyed by task (suite: subset), id and variant: suite subsets may share ids."""
    return (row["task"], row["id"], row["variant"])


def answer_probabilities(answer: NoulAnswer | ChoiceAnswer | ScoreAnswer) -> dict[str, float]:
    """An answer's probabilities by option (a yes/no answer's as true/false)."""
    if isinstance(answer, NoulAnswer):
        return {"true": answer.noul, "false": 1.0 - answer.noul}
    return dict(answer.probabilities)


def raw_probabilities(row: RecordRow) -> dict[str, float]:
    """The model's own read of an ``ok`` row, before any correction (for :func:`rows_arrays`)."""
    return row["reading"]["raw_probabilities"]


async def read_row(
    reader: Reader, base: RecordRow, body: dict[str, Any], question: str, priors: OptionPriors | None = None
) -> RecordRow:
    """One Jev request through ``decide`` (the service's path minus HTTP; ``priors`` as the service
    passes them) as a record row: ``base`` plus the answer, or plus the error (an engine error is
    evidence, never a crash or a wrong answer)."""
    started = time.monotonic()
    try:
        response = await decide(
            SystemOneRequest.model_validate(body), reader, request_id=uuid.uuid4().hex, priors=priors
        )
    except DecideError as error:
        return {**base, "status": "error", "error": {"type": error.error_type, "message": error.message}}
    latency_ms = (time.monotonic() - started) * 1000
    answer = response.answers[question]
    probabilities = answer_probabilities(answer)
    return {**base, "status": "ok", "probabilities": probabilities, "reading": answer.reading.model_dump(mode="json"), "latency_ms": latency_ms,
            "predicted": max(probabilities, key=probabilities.__getitem__)}  # fmt: skip


async def read_rows(
    reader: Reader,
    jobs: Iterable[tuple[RecordRow, dict[str, Any], str]],
    *,
    concurrency: int = 4,
    priors: OptionPriors | None = None,
) -> list[RecordRow]:
    """``(base, body, question)`` jobs through :func:`read_row`, at most ``concurrency`` in flight, in job order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(base: RecordRow, body: dict[str, Any], question: str) -> RecordRow:
        async with gate:
            return await read_row(reader, base, body, question, priors)

    return list(await asyncio.gather(*(one(*job) for job in jobs)))


class RecordWriter:
    """Collects record rows for one record file, resumably, and writes it (:func:`write_rows`) on close.

    While reads run, each row is appended to a plain journal beside the file
    (``<name>.partial.jsonl``) and flushed, so a killed run loses nothing: the next writer on the
    same path starts from the record file and the journal (a torn last journal line is cut), and
    :attr:`done` holds the keys already read successfully (failed rows are retried).

    ``async with RecordWriter(path) as sink: await sink.write(row)``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = journal_path(path)
        self.lock = asyncio.Lock()
        _drop_torn_tail(self.journal)
        self.rows: dict[Key, RecordRow] = {}
        if path.is_file():
            self.rows = {row_key(row): row for row in load_rows(path, timings=timings_path(path).is_file())}
        self.rows.update((row_key(row), row) for row in _lines(self.journal))
        self.done: set[Key] = {key for key, row in self.rows.items() if row.get("status") == "ok"}

    async def __aenter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sink = self.journal.open("a", encoding="utf-8")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.sink.close()
        if self.rows or not self.path.is_file():
            write_rows(self.path, self.rows.values())
        self.journal.unlink()

    async def write(self, row: RecordRow) -> None:
        async with self.lock:
            self.sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.sink.flush()
            self.rows[row_key(row)] = row

    async def read_all(
        self, reader: Reader, jobs: Iterable[tuple[RecordRow, dict[str, Any], str]], *, concurrency: int = 4,
        progress: Callable[[], None] | None = None, priors: OptionPriors | None = None,
    ) -> None:  # fmt: skip
        """Read every job not already done and record its row as it finishes."""
        gate = asyncio.Semaphore(concurrency)

        async def one(base: RecordRow, body: dict[str, Any], question: str) -> None:
            async with gate:
                row = await read_row(reader, base, body, question, priors)
            await self.write(row)
            if progress:
                progress()

        await asyncio.gather(*(one(*job) for job in jobs if row_key(job[0]) not in self.done))


def _drop_torn_tail(path: Path) -> None:
    """A killed writer can leave a last line without its newline: cut it, so the next append starts
    on a line of its own (the record it held is redone)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def _lines(path: Path) -> Iterable[RecordRow]:
    """The rows of a plain JSON-lines file (a writer's journal, or a record file from before the
    compressed format, for :func:`pack_plain`)."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:  # a torn last line from a killed run
            continue


def _stem(path: Path) -> str:
    if not path.name.endswith(ROWS_SUFFIX) or path.name.endswith(TIMINGS_SUFFIX):
        raise ValueError(
            f"{path}: record rows are read from <name>{ROWS_SUFFIX} files "
            "(a run folder with plain .jsonl rows converts with `decide eval pack DIR`)"
        )
    return path.name[: -len(ROWS_SUFFIX)]


def timings_path(path: Path) -> Path:
    """Where the decision ids and timings of the record file ``path`` live (``records.jsonl.gz`` →
    ``records.timings.jsonl.gz``)."""
    return path.with_name(_stem(path) + TIMINGS_SUFFIX)


def journal_path(path: Path) -> Path:
    """The plain journal a :class:`RecordWriter` appends to while reads run."""
    return path.with_name(_stem(path) + ".partial.jsonl")


def write_jsonl_gz(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """JSON lines, gzip-compressed byte for byte the same for the same rows: fixed level, no file
    name and mtime 0 in the header. Written to a temporary file, then moved into place."""
    payload = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    temporary = path.with_name(path.name + ".tmp")
    with (
        temporary.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=raw, mtime=0) as sink,
    ):
        sink.write(payload)
    os.replace(temporary, path)


def read_jsonl_gz(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a file :func:`write_jsonl_gz` wrote, in file order."""
    with gzip.open(path, "rt", encoding="utf-8") as source:
        for line in source:
            yield json.loads(line)


def split_timings(row: RecordRow) -> tuple[RecordRow, dict[str, Any] | None]:
    """(the row without :data:`TIMING_FIELDS` and :data:`READING_TIMING_FIELDS`, those fields keyed by
    the row's task, id and variant; None when the row has none, as an error row)."""
    moved = {name: row[name] for name in TIMING_FIELDS if name in row}
    kept = {name: value for name, value in row.items() if name not in TIMING_FIELDS}
    reading = row.get("reading")
    if isinstance(reading, dict) and (
        inner := {n: reading[n] for n in READING_TIMING_FIELDS if n in reading}
    ):
        moved["reading"] = inner
        kept["reading"] = {
            name: value for name, value in reading.items() if name not in READING_TIMING_FIELDS
        }
    if not moved:
        return kept, None
    return kept, {"task": row["task"], "id": row["id"], "variant": row["variant"], **moved}


def join_timings(row: RecordRow, timing: dict[str, Any] | None) -> RecordRow:
    """The row with its timing fields back (the inverse of :func:`split_timings`, key order aside)."""
    if timing is None:
        return row
    joined = {**row, **{name: timing[name] for name in TIMING_FIELDS if name in timing}}
    if "reading" in timing:
        joined["reading"] = {**row["reading"], **timing["reading"]}
    return joined


def write_rows(path: Path, rows: Iterable[RecordRow]) -> None:
    """Write a record file and its timings file: the last row per key, sorted by key."""
    latest = {row_key(row): row for row in rows}
    kept, timings = [], []
    for key in sorted(latest):
        row, timing = split_timings(latest[key])
        kept.append(row)
        if timing is not None:
            timings.append(timing)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_gz(path, kept)
    write_jsonl_gz(timings_path(path), timings)


def load_rows(path: Path, *, timings: bool = False) -> list[RecordRow]:
    """The last row per (task, id, variant) of a record file (or a run directory's ``records.jsonl.gz``),
    sorted by task, id and variant — never by the order reads happened to finish, so every split
    drawn over them is reproducible. ``timings``: join the decision ids and timings back
    (:func:`timings_path`; a figure that reports latency needs them)."""
    path = path / RECORDS if path.is_dir() else path
    _stem(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no record rows there")
    rows = {row_key(row): row for row in read_jsonl_gz(path)}
    if timings:
        if not timings_path(path).is_file():
            raise FileNotFoundError(f"{timings_path(path)}: no timings beside {path.name}")
        by_key = {row_key(timing): timing for timing in read_jsonl_gz(timings_path(path))}
        rows = {key: join_timings(row, by_key.get(key)) for key, row in rows.items()}
    return [rows[key] for key in sorted(rows)]


PLAIN_RECORD_FILES = ("records.jsonl", "a.jsonl", "b.jsonl")


def pack_plain(directory: Path) -> list[Path]:
    """Convert every plain record file under ``directory`` (``records.jsonl``, ``a.jsonl``,
    ``b.jsonl``, from before the compressed format) into its record and timings files, check that
    the rows read back equal the plain file's (last row per key), delete the plain file, and point
    manifests' ``reads`` at the new names. Returns the record files written."""
    written = []
    for plain in sorted(p for p in directory.rglob("*.jsonl") if p.name in PLAIN_RECORD_FILES):
        rows = {row_key(row): row for row in _lines(plain)}
        packed = plain.with_name(plain.name.removesuffix(".jsonl") + ROWS_SUFFIX)
        write_rows(packed, rows.values())
        if load_rows(packed, timings=True) != [rows[key] for key in sorted(rows)]:
            raise ValueError(f"{packed}: rows read back differ from {plain}'s")
        plain.unlink()
        written.append(packed)
    for manifest in sorted(directory.rglob("manifest.json")):
        text = manifest.read_text(encoding="utf-8")
        payload = json.loads(text)
        reads = payload.get("reads") if isinstance(payload, dict) else None
        if isinstance(reads, dict) and any(str(where).endswith(".jsonl") for where in reads.values()):
            payload["reads"] = {
                side: where + ".gz" if where.endswith(".jsonl") else where for side, where in reads.items()
            }
            manifest.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return written


def rows_arrays(
    rows: Sequence[RecordRow], probabilities_of: Callable[[RecordRow], dict[str, float]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (n, k) in the rows' option order, gold index (n,)) of rows sharing one option set."""
    options = rows[0]["options"]
    probabilities_of = probabilities_of or (lambda row: row["probabilities"])
    p = np.array([[probabilities_of(row)[option] for option in options] for row in rows])
    gold = np.array([options.index(row["gold"]) for row in rows])
    return p, gold
