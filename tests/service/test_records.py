"""What is kept: decision records hold ids and raw probabilities, never the state text; retention
prunes old records without gold answers; API keys never reach the store."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3

import pytest

from calibration.open import open_store
from service.retention import prune_periodically

VERSION = "decide-prompt/2"

pytestmark = pytest.mark.anyio

STATE = "Customer 88123 (jane@example.com) writes: my card ending 4242 was charged twice."
INSTRUCTIONS = "Does the customer mention a double charge on card 4242?"
KEY = "od-records-key-0123456789"


async def test_records_hold_probabilities_and_ids_not_the_request_text(
    client_factory, local_engine, tmp_path
):
    path = tmp_path / "store.sqlite3"
    body = {"state": STATE, "questions": {"double": {"type": "noul", "instructions": INSTRUCTIONS}}}
    async with client_factory(local_engine, store=open_store(path), api_keys=[KEY]) as client:
        answer = (
            await client.post("/v1/systemone", json=body, headers={"authorization": f"Bearer {KEY}"})
        ).json()
    decision_id = answer["answers"]["double"]["x_reading"]["decision_id"]
    row = (
        sqlite3.connect(path)
        .execute("SELECT id, options, uncalibrated_probabilities FROM decisions")
        .fetchone()
    )
    assert row[0] == decision_id and row[1] == '["true", "false"]'
    dump = b"".join(line.encode() for line in sqlite3.connect(path).iterdump())
    for secret in ("jane@example.com", "4242", "88123", INSTRUCTIONS, KEY):
        assert secret.encode() not in dump and secret.encode() not in path.read_bytes()


def test_prune_deletes_old_records_without_gold_only(tmp_path):
    from calibration.store import DecisionRecord

    store = open_store(tmp_path / "store.sqlite3")
    records = [
        DecisionRecord(
            f"dec_{i}", "m", "r", "noul", 2, None, ["true", "false"], [0.6, 0.4], True, read_version=VERSION
        )
        for i in range(3)
    ]
    store.add_decisions(records)
    store.add_feedback("dec_1", "true")
    assert store.prune_decisions(dt.datetime.now(dt.UTC) - dt.timedelta(days=1)) == 0  # all newer
    assert store.prune_decisions(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)) == 2
    assert store.decision("dec_0") is None and store.decision("dec_2") is None
    assert store.decision("dec_1") is not None  # has a gold answer: calibration data, kept


async def test_pruning_runs_at_once_and_refuses_zero_retention(tmp_path):
    from calibration.store import DecisionRecord

    store = open_store(tmp_path / "store.sqlite3")
    store.add_decisions(
        [
            DecisionRecord(
                "dec_old",
                "m",
                "r",
                "noul",
                2,
                None,
                ["true", "false"],
                [0.5, 0.5],
                True,
                read_version=VERSION,
            )
        ]
    )
    await asyncio.sleep(0.05)
    task = asyncio.create_task(prune_periodically(store, dt.timedelta(milliseconds=10)))
    await asyncio.sleep(0.5)
    task.cancel()
    assert store.decision("dec_old") is None
    with pytest.raises(ValueError):
        await prune_periodically(store, dt.timedelta(0))
