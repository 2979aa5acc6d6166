"""Read task records through the product's own decision path, with bounded concurrency."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from eval.tasks import Record, Task, requests_for
from readers.reader import Reader
from service.decide import decide
from service.protocol import SystemOneRequest


@dataclass(frozen=True)
class RecordRead:
    """One record's answer: probabilities by option name (gold label names) and how they were read."""

    id: str
    task: str
    variant: str
    gold: str
    probabilities: dict[str, float]
    reading: dict[str, Any]
    latency_ms: float

    @property
    def predicted(self) -> str:
        return max(self.probabilities, key=self.probabilities.__getitem__)

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "predicted": self.predicted}


async def read_one(reader: Reader, body: dict[str, Any], question: str) -> tuple[dict[str, Any], float]:
    """One Jev request through ``decide`` (the service's path minus HTTP): (reading, latency ms)."""
    started = time.monotonic()
    response = await decide(SystemOneRequest.model_validate(body), reader, request_id=uuid.uuid4().hex)
    latency_ms = (time.monotonic() - started) * 1000
    return response.answers[question].reading.model_dump(mode="json"), latency_ms


async def read_records(reader: Reader, task: Task, records: list[Record], *, variant: str = "original", concurrency: int = 4) -> list[RecordRead]:
    """Every record through ``decide`` (the service's path minus HTTP), in record order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(record: Record, body: dict[str, Any]) -> RecordRead:
        async with gate:
            reading, latency_ms = await read_one(reader, body, "answer")
        return RecordRead(record.id, task.name, variant, record.gold, reading["raw_probabilities"], reading, latency_ms)

    return await asyncio.gather(*(one(record, body) for record, body in requests_for(task, records, variant)))
