"""decide eval dev-reads and decide eval regression: read defaults chosen per question type on the
dev split, and two read policies paired on the test samples."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from eval.decisions.dev_reads import (
    NOUL_LIFT_MARGIN,
    choose,
    dev_reads_report,
    dev_reads_table,
    run_dev_reads,
)
from eval.decisions.regression import ReadPolicy, regression_table, run_regression, side_by_side_table
from eval.decisions.tasks import TASKS
from eval.evidence.rows import load_rows
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
        if question_type == "noul":  # the Brier score, among the lifts near the best
            assert pick["lift"] >= max(lifts) - NOUL_LIFT_MARGIN - 1e-9 and pick["rule"].startswith(
                "lowest Brier"
            )
        else:
            assert pick["lift"] == pytest.approx(max(lifts)) and pick["rule"] == "highest lift"
    # the noul and choice reads tie: the rule keeps the current layout
    assert chosen["noul"]["layout"] == chosen["choice"]["layout"] == "decide-prompt/4"
    table = dev_reads_table(report)
    assert "| decide-prompt/5 | sst3 | score | 4 |" in table and "chosen for score: " in table
    # the report is a function of the run files alone
    assert dev_reads_report(tmp_path, versions) == report


def test_yes_no_reads_are_chosen_by_brier_near_the_best_lift_and_the_others_by_lift():
    # (type, layout, prior setting, mean lift, mean Brier): the committed dev figures of irony's reads
    noul = [
        ("noul", "decide-prompt/3", "raw", -0.010, 0.4922),
        ("noul", "decide-prompt/3", "prior", -0.135, 0.4801),  # best Brier, but far below the best lift
        ("noul", "decide-prompt/4", "raw", 0.000, 0.5545),
        ("noul", "decide-prompt/4", "prior", -0.145, 0.5012),
    ]
    pick = choose(noul, "noul", "decide-prompt/4")
    assert (pick["layout"], pick["prior"], pick["rule"]) == (
        "decide-prompt/3",
        False,
        "lowest Brier within 2 points of the best lift",
    )
    # more than the margin below the best lift: out of the running, whatever its Brier
    assert choose([noul[2], ("noul", "decide-prompt/3", "raw", -0.021, 0.40)], "noul", "")["layout"] == (
        "decide-prompt/4"
    )
    # equal Brier to 4 places: the higher lift, then the current layout, then the raw read
    tied = [("noul", "a", "raw", -0.01, 0.50001), ("noul", "b", "raw", 0.0, 0.50004)]
    assert choose(tied, "noul", "a")["layout"] == "b"
    same = [
        ("noul", "a", "prior", 0.0, 0.5),
        ("noul", "b", "prior", 0.0, 0.5),
        ("noul", "b", "raw", 0.0, 0.5),
    ]
    assert (choose(same, "noul", "b")["layout"], choose(same, "noul", "b")["prior"]) == ("b", False)
    # choice and score keep the lift rule: the best lift, though another read's Brier is lower
    choice = [("choice", "x", "raw", 0.15, 0.40), ("choice", "y", "prior", 0.22, 0.53)]
    assert choose(choice, "choice", "x") | {"lift": 0, "brier": 0} == {
        "layout": "y", "prior": True, "lift": 0, "brier": 0, "beats_majority": True, "rule": "highest lift",
    }  # fmt: skip


def test_read_policies_are_parsed_and_bad_ones_named():
    assert ReadPolicy.parse("decide-prompt/4:choice") == ReadPolicy("decide-prompt/4", PriorCorrection.CHOICE)
    assert str(ReadPolicy.parse("decide-prompt/5:all")) == "decide-prompt/5:all"
    for text, message in [
        ("decide-prompt/4", "LAYOUT:PRIOR"),
        ("decide-prompt/0:choice", "unknown prompt version"),
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
