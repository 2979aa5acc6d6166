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
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

from readers.errors import DecideError
from readers.reader import Reader
from service.pipeline.decide import decide
from service.pipeline.prior import OptionPriors
from service.protocol import ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneRequest

RECORDS = "records.jsonl"

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
    """Appends record rows to a JSONL file, resumably: a torn last line (a killed writer) is cut,
    and :attr:`done` holds the keys already read successfully (failed rows are retried).

    ``async with RecordWriter(path) as sink: await sink.write(row)``; each row is flushed as written.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = asyncio.Lock()
        _drop_torn_tail(path)
        self.done: set[Key] = {row_key(row) for row in _lines(path) if row.get("status") == "ok"}

    async def __aenter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sink = self.path.open("a", encoding="utf-8")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.sink.close()

    async def write(self, row: RecordRow) -> None:
        async with self.lock:
            self.sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.sink.flush()

    async def read_all(
        self, reader: Reader, jobs: Iterable[tuple[RecordRow, dict[str, Any], str]], *, concurrency: int = 4,
        progress: Callable[[], None] | None = None, priors: OptionPriors | None = None,
    ) -> None:  # fmt: skip
        """Read every job not already done and append its row as it finishes."""
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
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:  # a torn last line from a killed run
            continue


def load_rows(path: Path) -> list[RecordRow]:
    """The last row per (task, id, variant) of a record file (or a run directory's ``records.jsonl``),
    sorted by task, id and variant — never by the order reads happened to finish, so every split
    drawn over them is reproducible."""
    path = path / RECORDS if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no record rows there")
    rows = {row_key(row): row for row in _lines(path)}
    return [rows[key] for key in sorted(rows)]


def rows_arrays(
    rows: Sequence[RecordRow], probabilities_of: Callable[[RecordRow], dict[str, float]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (n, k) in the rows' option order, gold index (n,)) of rows sharing one option set."""
    options = rows[0]["options"]
    probabilities_of = probabilities_of or (lambda row: row["probabilities"])
    p = np.array([[probabilities_of(row)[option] for option in options] for row in rows])
    gold = np.array([options.index(row["gold"]) for row in rows])
    return p, gold
