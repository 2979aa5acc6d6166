"""Record files on disk: compressed, deterministic on rerun, timings apart; the conversion of plain
files; and the commands that read committed records (prior-figures)."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eval.decisions.runner import run_tasks
from eval.evidence.rows import (
    RECORDS,
    load_rows,
    pack_plain,
    raw_probabilities,
    read_jsonl_gz,
    row_key,
    split_timings,
    timings_path,
)
from opendecide.cli import app

FOUR_TASKS = ["sst2", "ag_news", "emotion", "irony"]


@pytest.fixture(scope="module")
def twice(local_engine, tmp_path_factory) -> tuple[Path, Path]:
    """The same small `decide eval tasks` run (every task, 2 records each) made twice into two
    folders on the embedded model. One read in flight and answers uncorrected: the embedded engine's
    probabilities move in the 7th decimal place with how its micro-batches were padded, and both more reads
    in flight and the prior's content-free reads (read at once) batch by timing."""
    from service.pipeline.prior import PriorCorrection

    first, second = (tmp_path_factory.mktemp("twice") / name for name in ("first", "second"))
    for out in (first, second):
        # Each run from a cold engine, as a rerun in a new process: reads of prompts the engine kept
        # equal fresh ones to float rounding only; and nobody counted active, since a batch computes
        # in smaller chunks for 5 s after another tenant's (readers/engines/turns.py), which moves
        # its probabilities in the 7th decimal place (an earlier test file's requests did that).
        local_engine.prefix_cache.clear()
        local_engine._active.last_started.clear()
        asyncio.run(
            run_tasks(
                local_engine,
                out,
                tasks=FOUR_TASKS,
                limit=2,
                concurrency=1,
                prior_correction=PriorCorrection.OFF,
            )
        )
    return first, second


@pytest.mark.slow  # 28 reads
def test_a_rerun_rewrites_only_the_timings(twice):
    first, second = twice
    rows = (first / RECORDS).read_bytes()
    assert rows == (second / RECORDS).read_bytes()
    assert timings_path(first / RECORDS).is_file() and timings_path(second / RECORDS).is_file()
    assert timings_path(first / RECORDS).read_bytes() != timings_path(second / RECORDS).read_bytes()
    header = rows[:10]  # gzip: magic, method, flags (no name), mtime 0
    assert header[:4] == b"\x1f\x8b\x08\x00" and header[4:8] == b"\x00\x00\x00\x00"
    plain = [json.loads(line) for line in gzip.decompress(rows).decode().splitlines()]
    assert [row_key(row) for row in plain] == sorted(row_key(row) for row in plain)
    assert all("latency_ms" not in row and "decision_id" not in row["reading"] for row in plain)
    joined = load_rows(first, timings=True)
    assert all(row["reading"]["decision_id"].startswith("dec_") and row["latency_ms"] > 0 for row in joined)
    assert [split_timings(row)[0] for row in joined] == plain


def test_plain_record_files_convert_with_their_content(tmp_path):
    rows = [
        {"id": "sst2-2", "task": "sst2", "variant": "original", "status": "error", "error": {"type": "t", "message": "m"}},
        {"id": "sst2-1", "task": "sst2", "variant": "original", "status": "ok", "probabilities": {"a": 1.0},
         "reading": {"decision_id": "dec_1", "label_mass": 0.5, "latency_ms": 3.0, "engine_latency_ms": 2.0}, "latency_ms": 4.0},
        {"id": "sst2-2", "task": "sst2", "variant": "original", "status": "ok", "probabilities": {"a": 1.0},
         "reading": {"decision_id": "dec_2", "label_mass": 0.25, "latency_ms": 5.0, "queued_ms": 1.0}, "latency_ms": 6.0},
    ]  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "manifest.json").write_text(json.dumps({"reads": {"a": "a.jsonl", "b": "../other/b.jsonl"}}))
    (run / "load.jsonl").write_text('{"shape": "short"}\n')  # not record rows: left alone
    assert pack_plain(tmp_path) == [run / "a.jsonl.gz"]
    assert not (run / "a.jsonl").exists() and (run / "load.jsonl").is_file()
    assert json.loads((run / "manifest.json").read_text())["reads"] == {
        "a": "a.jsonl.gz",
        "b": "../other/b.jsonl.gz",
    }
    # the last row per key wins, as load_rows always read it; timings leave the rows
    assert load_rows(run / "a.jsonl.gz", timings=True) == [rows[1], rows[2]]
    assert [row["reading"] for row in load_rows(run / "a.jsonl.gz")] == [
        {"label_mass": 0.5},
        {"label_mass": 0.25},
    ]
    assert list(read_jsonl_gz(run / "a.timings.jsonl.gz"))[1] == {
        "task": "sst2", "id": "sst2-2", "variant": "original", "latency_ms": 6.0,
        "reading": {"decision_id": "dec_2", "latency_ms": 5.0, "queued_ms": 1.0},
    }  # fmt: skip
    with pytest.raises(ValueError, match="decide eval pack"):
        load_rows(tmp_path / "run" / "load.jsonl")


def test_a_figure_that_reports_latency_needs_the_timings_file(tmp_path):
    from eval.evidence.rows import write_rows

    row = {"id": "x-1", "task": "x", "variant": "original", "status": "ok", "latency_ms": 7.0, "reading": {}}
    write_rows(tmp_path / RECORDS, [row])
    timings_path(tmp_path / RECORDS).unlink()
    assert load_rows(tmp_path) == [{key: value for key, value in row.items() if key != "latency_ms"}]
    with pytest.raises(FileNotFoundError, match="records.timings.jsonl.gz"):
        load_rows(tmp_path, timings=True)


@pytest.mark.slow  # uses the two runs above
def test_prior_figures_from_a_run(twice):
    first, second = twice
    result = CliRunner().invoke(app, ["eval", "prior-figures", str(first), "--before", str(second)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    original = [row for row in load_rows(first) if row["variant"] == "original"]
    ag_news = [row for row in original if row["task"] == "ag_news"]
    least = sum(min(raw := raw_probabilities(row), key=raw.__getitem__) == "Sci/Tech" for row in ag_news)
    assert lines[0].startswith("ag_news label mass, median over 2 records: ")
    assert lines[1].startswith(f"ag_news raw read: Sci/Tech least probable on {least} of 2 records")
    for task in FOUR_TASKS:
        answers = dict(Counter(row["predicted"] for row in original if row["task"] == task).most_common())
        assert any(
            line.startswith(f"{task}: majority ") and line.endswith(f"answers {answers}") for line in lines
        )
    # the same reads twice: the raw reads of one against the (uncorrected) answers of the other
    # differ by rounding alone
    head, _, difference = lines[-1].rpartition(": ")
    assert head == f"largest raw-read difference from {second} (all 14 rows, both orders)"
    assert float(difference) < 1e-12
