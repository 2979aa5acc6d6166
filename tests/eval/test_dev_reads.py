"""decide eval dev-reads and decide eval regression: read defaults chosen per question type on the
dev split, and two read policies paired on the test samples."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from eval.dev_reads import dev_reads_report, dev_reads_table, run_dev_reads
from eval.evidence import load_rows
from eval.regression import ReadPolicy, regression_table, run_regression, side_by_side_table
from eval.tasks import TASKS
from opendecide.cli import app
from service.pipeline.prior import PriorCorrection

TASKS_READ = ["sst2", "irony", "sst3"]  # one of each question type


@pytest.mark.slow  # 4 dev records × 3 tasks × 2 layouts on the embedded model, with priors
def test_dev_reads_chooses_per_question_type_from_dev_records_only(tmp_path, local_engine):
    versions = ["decide-prompt/4", "decide-prompt/5"]
    report = asyncio.run(
        run_dev_reads(local_engine, tmp_path, prompt_versions=versions, tasks=TASKS_READ, limit=4)
    )
    dev_ids = {r.id for task in TASKS_READ for r in TASKS[task].records("dev")}
    for version in versions:
        rows = load_rows(tmp_path / version.replace("/", "-"))
        assert {row["id"] for row in rows} <= dev_ids  # never a test record
        assert {row["variant"] for row in rows} == {"original"}
        # read with the prior on every question: each row keeps the raw read beside the answer
        assert all(row["reading"]["prior_correction"] for row in rows if row["status"] == "ok")
    layout = report["layouts"]["decide-prompt/5"]
    assert set(layout["types"]) == {"noul", "choice", "score"}
    sst3 = layout["tasks"]["sst3"]
    assert {"mae", "spearman", "brier", "accuracy"} <= set(sst3["raw"]) and sst3["n"] == 4
    # noul and choice text are the same under both layouts: their figures agree
    other = report["layouts"]["decide-prompt/4"]["tasks"]
    assert other["sst2"]["raw"]["accuracy"] == layout["tasks"]["sst2"]["raw"]["accuracy"]
    chosen = report["chosen"]
    assert set(chosen) == {"noul", "choice", "score"}
    for question_type, pick in chosen.items():
        lifts = [
            report["layouts"][v]["types"][question_type]["lift"][s]
            for v in versions
            for s in ("raw", "prior")
        ]
        assert pick["lift"] == pytest.approx(max(lifts))
    # the noul and choice reads tie: the rule keeps the current layout
    assert chosen["noul"]["layout"] == chosen["choice"]["layout"] == "decide-prompt/4"
    table = dev_reads_table(report)
    assert "| decide-prompt/5 | sst3 | score | 4 |" in table and "chosen for score: " in table
    # the report is a function of the run files alone
    assert dev_reads_report(tmp_path, versions) == report


def test_read_policies_are_parsed_and_bad_ones_named():
    assert ReadPolicy.parse("decide-prompt/4:choice") == ReadPolicy("decide-prompt/4", PriorCorrection.CHOICE)
    assert str(ReadPolicy.parse("decide-prompt/5:all")) == "decide-prompt/5:all"
    for text, message in [
        ("decide-prompt/4", "LAYOUT:PRIOR"),
        ("decide-prompt/9:choice", "unknown prompt version"),
        ("decide-prompt/4:some", "prior correction is one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            ReadPolicy.parse(text)
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "regression",
            "--out",
            "x",
            "--baseline",
            "decide-prompt/4",
            "--candidate",
            "decide-prompt/5:all",
        ],
    )
    assert result.exit_code == 2 and "--baseline" in result.output


@pytest.mark.slow  # 4 test records × 3 tasks under two policies on the embedded model
def test_regression_pairs_two_policies_per_task_and_type(tmp_path, local_engine):
    report = asyncio.run(
        run_regression(
            local_engine,
            tmp_path,
            baseline=ReadPolicy.parse("decide-prompt/4:off"),
            candidate=ReadPolicy.parse("decide-prompt/5:off"),
            tasks=TASKS_READ,
            limit=4,
        )
    )
    assert report["policies"] == {"baseline": "decide-prompt/4:off", "candidate": "decide-prompt/5:off"}
    test_ids = {r.id for task in TASKS_READ for r in TASKS[task].records("test")}
    assert {row["id"] for row in load_rows(tmp_path / "baseline")} <= test_ids
    for task in ("sst2", "irony"):  # the same text and reads under both: no difference
        row = report["tasks"][task]
        assert row["baseline"] == row["candidate"] and row["difference"] == 0 and not row["regresses"]
    assert set(report["types"]) == {"noul", "choice", "score"} and report["types"]["score"]["n"] == 4
    # a pooled type's majority is each task answered with its own majority answer
    choice = report["types"]["choice"]
    assert choice["majority"] == report["tasks"]["sst2"]["majority"] and choice["tasks"] == ["sst2"]
    table = regression_table(report)
    assert "| sst3 | score | 4 |" in table and "| all score (sst3) | score | 4 |" in table
    side = side_by_side_table({"a": tmp_path / "baseline", "b": tmp_path / "candidate"}).splitlines()
    assert side[2].startswith("| sst2 | choice | 4 |") and len(side) == 2 + 3 + 1 + 2
    lift = report["types"]["choice"]["baseline"] - report["types"]["choice"]["majority"]
    assert (
        side[-2].startswith("a: lift over the majority rate, points: ")
        and f"choice {lift * 100:+.1f}" in side[-2]
    )
