"""The public suite's format: build from the shipped tasks, verify, run on the embedded model, score."""

from __future__ import annotations

import json

import pytest

from eval.decisions.tasks import TASKS
from eval.evidence.manifest import RunRefused
from eval.evidence.rows import load_rows, timings_path
from eval.suite.records import build_from_tasks, load_suite
from eval.suite.run import run_suite, score_suite_with_engine
from eval.suite.score import jev_minus_arm, score_suite
from eval.suite.table import suite_table
from tests.eval.support import fake_irony

pytestmark = pytest.mark.anyio


def test_build_and_verify(tmp_path):
    digests = build_from_tasks(tmp_path)
    records, checks = load_suite(tmp_path)
    assert {subset: check["sha256"] for subset, check in checks.items()} == digests and len(
        records
    ) == 300 * len(TASKS)
    assert {check["status"] for check in checks.values()} == {
        "unknown"
    }  # no published checksum for the task samples
    sst3 = [r for r in records if r.subset == "sst3"]
    assert {r.gold for r in sst3} == {"0", "1", "2"} and sst3[0].question_type == "score"
    irony = [r for r in records if r.subset == "irony"]
    assert {r.gold for r in irony} == {"true", "false"} and irony[0].question_type == "noul"
    (tmp_path / "sst2" / "all.jsonl").write_bytes((tmp_path / "sst2" / "all.jsonl").read_bytes() + b"\n")
    with pytest.raises(RunRefused, match="sha256"):
        load_suite(tmp_path)


def test_decide_eval_suite_build_from_tasks_prints_each_subsets_sha256(tmp_path):
    from typer.testing import CliRunner

    from opendecide.cli import app

    result = CliRunner().invoke(app, ["eval", "suite", "build-from-tasks", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    _, checks = load_suite(tmp_path)
    assert result.output == "".join(f"{subset}: {checks[subset]['sha256']}\n" for subset in TASKS)
    refused = CliRunner().invoke(app, ["eval", "suite", "--data", str(tmp_path)])
    assert refused.exit_code == 2 and "give --data and --out" in refused.output


def test_build_from_tasks_writes_the_rows_both_samples_leave(tmp_path):
    from typer.testing import CliRunner

    from eval.decisions.samples import unsampled_records
    from opendecide.cli import app

    fake_irony(tmp_path / "upstream")
    args = ["eval", "suite", "build-from-tasks", "--out", str(tmp_path / "suite"), "--tasks", "irony"]
    result = CliRunner().invoke(app, [*args, "--unsampled", str(tmp_path / "upstream")])
    assert result.exit_code == 0, result.output
    records, checks = load_suite(tmp_path / "suite")
    assert result.output == f"irony-unsampled: {checks['irony-unsampled']['sha256']}\n"
    rest = unsampled_records(tmp_path / "upstream", "irony")
    assert [r.id for r in records] == [r.id for r in rest] and len(rest) == 120
    assert {r.gold for r in records} == {"true", "false"} and records[0].question_type == "noul"
    manifest = json.loads((tmp_path / "suite" / "irony-unsampled" / "manifest.json").read_text())
    assert manifest["source"].startswith("upstream rows in neither shipped sample: cardiffnlp/tweeteval")
    bad = CliRunner().invoke(app, [*args[:-1], "irony,nope"])
    assert bad.exit_code == 2 and "nope" in bad.output


def test_jev_minus_arm_hand_computed():
    difference, lo, hi = jev_minus_arm(0.8, 400, 0.7, 300)
    se = (0.8 * 0.2 / 400 + 0.7 * 0.3 / 300) ** 0.5
    assert difference == pytest.approx(0.1) and (lo, hi) == pytest.approx(
        (0.1 - 1.959964 * se, 0.1 + 1.959964 * se)
    )


@pytest.mark.slow  # 48 reads
async def test_run_and_score_a_small_suite(local_engine, tmp_path):
    data = tmp_path / "suite"
    build_from_tasks(data)
    for subset in TASKS:  # keep 8 records of each subset (manifests dropped)
        lines = (data / subset / "all.jsonl").read_text().splitlines()[:8]
        (data / subset / "all.jsonl").write_text("\n".join(lines) + "\n")
        (data / subset / "manifest.json").unlink()
    # one subset named as a published one, so "Jev minus arm" is computed against its published figure
    (data / "sst2").rename(data / "boolq")
    out = tmp_path / "run"
    with pytest.raises(RunRefused, match="no manifest.json"):
        await run_suite(local_engine, data, out)
    manifest = await run_suite(local_engine, data, out, allow_unverified=True)
    assert manifest["status"] == "success" and manifest["records"] == 48
    report = score_suite(out)
    assert report["overall"]["n"] == 48 and report["errors"] == 0
    assert "jev_minus_arm" in report["subsets"]["boolq"] and "jev_minus_arm" not in report["subsets"]["irony"]
    assert set(report["question_types"]) == {"choice", "noul", "score"}
    assert report["subsets"]["sst5"]["n"] == 8
    assert "| all | 6 | 48 |" in suite_table(report)
    rows = load_rows(out)
    assert len({(row["task"], row["id"]) for row in rows}) == 48  # sst5 and sst3 share their ids
    timings = timings_path(out / "records.jsonl.gz").read_bytes()
    # what ``decide eval suite`` calls: the engine by spec, the run resumed (nothing left to read), then the report files
    again = await score_suite_with_engine("local", data, out, allow_unverified=True)
    # nothing read again: a read would have a new decision id in the timings
    assert timings_path(out / "records.jsonl.gz").read_bytes() == timings and len(load_rows(out)) == 48
    assert json.loads((out / "suite.json").read_text()) == json.loads(json.dumps(again)) and (
        out / "suite.md"
    ).read_text() == suite_table(again)


@pytest.mark.slow  # 6 reads under two layouts, and a resume refused
async def test_a_suite_is_read_under_the_layout_it_names(local_engine, tmp_path):
    data = tmp_path / "suite"
    build_from_tasks(data, tasks=["irony"])
    lines = (data / "irony" / "all.jsonl").read_text().splitlines()[:3]
    (data / "irony" / "all.jsonl").write_text("\n".join(lines) + "\n")
    (data / "irony" / "manifest.json").unlink()
    out = tmp_path / "run"
    manifest = await run_suite(
        local_engine,
        data,
        out,
        allow_unverified=True,
        prior_correction="off",
        prompt_version="decide-prompt/3",
    )
    assert manifest["prompt_version"] == "decide-prompt/3" and manifest["records"] == 3
    with pytest.raises(RunRefused, match="prompt version"):
        await run_suite(local_engine, data, out, allow_unverified=True, prior_correction="off")
    await run_suite(
        local_engine,
        data,
        tmp_path / "lead",
        allow_unverified=True,
        prior_correction="off",
        prompt_version="decide-prompt/6",
    )
    # decide-prompt/3 reads yes/no questions with no "Answer:" lead: each prompt is shorter than /6's
    tokens = [
        {row["id"]: row["reading"]["prompt_tokens"] for row in load_rows(run) if row["status"] == "ok"}
        for run in (out, tmp_path / "lead")
    ]
    assert len(tokens[0]) == 3 and all(tokens[0][i] < tokens[1][i] for i in tokens[0])
    with pytest.raises(ValueError, match="unknown prompt version"):
        await run_suite(local_engine, data, tmp_path / "other", prompt_version="decide-prompt/99")


@pytest.mark.slow  # two suite runs
async def test_subsets_sharing_ids_are_kept_apart_and_resume_is_guarded(local_engine, tmp_path):
    data = tmp_path / "suite"
    build_from_tasks(data)
    for subset in TASKS:
        if subset in ("sst2", "irony"):
            lines = (data / subset / "all.jsonl").read_text().splitlines()[:4]
            (data / subset / "all.jsonl").write_text("\n".join(lines) + "\n")
            (data / subset / "manifest.json").unlink()
        else:
            import shutil

            shutil.rmtree(data / subset)
    # a second subset with the same ids (as massive-en-US and massive-de-DE have)
    import shutil

    shutil.copytree(data / "sst2", data / "sst2-copy")
    out = tmp_path / "run"
    await run_suite(local_engine, data, out, allow_unverified=True)
    report = score_suite(out)
    assert (
        report["subsets"]["sst2"]["n"] == 4
        and report["subsets"]["sst2-copy"]["n"] == 4
        and report["overall"]["n"] == 12
    )
    with pytest.raises(RunRefused, match="read mode"):
        await run_suite(local_engine.with_top_k(2), data, out, allow_unverified=True)
