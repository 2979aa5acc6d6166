"""The suite's scorecard: metrics by hand, the family bootstrap, the record contract, checksums, and a real
run on the embedded model over a small suite with a score subset, a distribution subset and families."""

from __future__ import annotations

import asyncio
import doctest
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

import eval.suite.scorecard
from calibration.metrics import level_absolute_error
from eval.decisions.tasks import TASKS, load_sample, spread
from eval.evidence.manifest import RunRefused
from eval.evidence.rows import RECORDS, load_rows, rows_arrays, timings_path
from eval.suite.records import load_suite, write_subset
from eval.suite.run import run_suite
from eval.suite.score import score_suite
from eval.suite.scorecard import (
    checksum_status,
    families_complete,
    family_bootstrap,
    js_divergence_bits,
    level_spearman,
    published_checksums,
    total_variation,
)
from eval.suite.table import suite_table
from tests.eval.support import copy_run

# -- metrics, by hand


def test_doctests():
    result = doctest.testmod(eval.suite.scorecard)
    assert result.attempted >= 4 and result.failed == 0


def test_level_mae_and_spearman_by_hand():
    p = [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]]
    gold = [2, 0, 1, 1]
    # expected levels 2.0, 0.5, 1.4, 0.0 → errors 0, 0.5, 0.4, 1.0
    assert level_absolute_error(p, gold) == pytest.approx(1.9 / 4)
    # ranks: expected (4, 2, 3, 1); gold (4, 1, 2.5, 2.5) (ties averaged) → Pearson of the ranks
    r_pred, r_gold = np.array([4, 2, 3, 1.0]), np.array([4, 1, 2.5, 2.5])
    by_hand = np.corrcoef(r_pred, r_gold)[0, 1]
    assert level_spearman(p, gold) == pytest.approx(by_hand)
    assert level_spearman(p, [1, 1, 1, 1]) is None  # a constant side has no rank correlation


def test_distances_by_hand():
    p, q = np.array([[0.9, 0.1], [0.25, 0.75]]), np.array([[0.6, 0.4], [0.25, 0.75]])
    m = (p[0] + q[0]) / 2

    def kl(a, b):
        return sum(x * math.log2(x / y) for x, y in zip(a, b) if x > 0)

    assert js_divergence_bits(p, q) == pytest.approx([0.5 * kl(p[0], m) + 0.5 * kl(q[0], m), 0.0], abs=1e-12)
    assert total_variation(p, q) == pytest.approx([0.3, 0.0])
    assert js_divergence_bits([[1.0, 0.0, 0.0]], [[0.0, 0.5, 0.5]]) == pytest.approx([1.0])


def test_families_complete():
    assert families_complete([True, False, True, True], ["a", "a", "b", "c"]) == (2, 3)


def test_family_bootstrap_clusters_whole_families():
    # 4 families of 10 identical records each: 2 all right, 2 all wrong.
    families = [f"f{i // 10}" for i in range(40)]
    correct = np.array([i < 20 for i in range(40)], dtype=float)

    def accuracy(ix):
        return {"accuracy": float(correct[ix].mean())}

    clustered = family_bootstrap(["s"] * 40, families, accuracy, resamples=400, seed=1)["accuracy"]
    per_record = family_bootstrap(["s"] * 40, [str(i) for i in range(40)], accuracy, resamples=400, seed=1)[
        "accuracy"
    ]
    # with 4 families a resample can hold no right family at all; 40 independent records cannot swing so far
    assert clustered[0] <= 0.25 and clustered[1] >= 0.75
    assert 0.25 < per_record[0] < 0.5 < per_record[1] < 0.75
    assert (
        family_bootstrap(["s"] * 40, families, accuracy, resamples=400, seed=1)["accuracy"] == clustered
    )  # seeded
    # every resample keeps each stratum's family count: a one-family stratum is always drawn whole
    both = family_bootstrap(
        ["a"] * 3 + ["b"] * 2,
        ["x"] * 3 + ["y", "z"],
        lambda ix: {"n_a": float((ix < 3).sum())},
        resamples=50,
        seed=0,
    )
    assert both["n_a"] == (3.0, 3.0)
    assert family_bootstrap(["s"], ["f"], lambda ix: {"none": None}, resamples=5, seed=0) == {"none": None}
    with pytest.raises(ValueError, match="resamples"):
        family_bootstrap(["s"], ["f"], accuracy, resamples=0, seed=0)


def test_checksum_status_and_the_shipped_table():
    assert checksum_status("ab", published="ab", manifest=None) == "verified"
    assert checksum_status("ab", published="ab", manifest="ab") == "verified"
    assert checksum_status("ab", published="cd", manifest="ab") == "mismatch"
    assert checksum_status("ab", published=None, manifest="cd") == "mismatch"
    assert checksum_status("ab", published=None, manifest=None) == "unknown"
    # the published vitaminc-dev dataset_sha256 (Nimble docs/PUBLIC_BENCHMARKS.md) ships inside the package
    assert (
        published_checksums()["vitaminc-dev"]
        == "6144a345cb8846b6594f07a0037b1221b2d9633b20d8a9bfd14f9111d15965bc"
    )


# -- a small suite in the contract's format

SCORE_LEVELS = ["very negative", "negative", "mixed", "positive", "very positive"]


def _score_subset(n: int) -> list[dict]:
    """SST-2 reviews asked as a 5-level score; gold 4 or 3 for positive, 0 or 1 for negative; families of 2."""
    records = spread(load_sample("sst2"), n)
    question = {
        "type": "score",
        "instructions": "How positive is this movie review?",
        "criteria": SCORE_LEVELS,
    }
    return [
        {
            "id": r.id, "split": "test", "domain": "reviews", "family": f"review-pair-{i // 2}", "source_family": "sst2",
            "input": {"state": {"review": r.text}, "questions": {"rating": question}},
            "reference": {"target": str(4 - i % 2) if r.gold == "positive" else i % 2},  # both encodings
        }
        for i, r in enumerate(records)
    ]  # fmt: skip


def _distribution_subset(n: int) -> list[dict]:
    """Irony tweets with a human label distribution (as civil_comments: {"true": share, "false": 1 - share})."""
    records = spread(load_sample("irony"), n)
    return [
        {
            "id": r.id, "split": "test", "domain": "tweets", "family": f"thread-{i // 3}", "source_family": "irony",
            "input": {"state": r.text, "questions": {"ironic": TASKS["irony"].question()}},
            "reference": {"target": r.gold, "distribution": {"true": share, "false": 1 - share}},
        }
        for i, r in enumerate(records)
        for share in [(0.8 if i % 2 else 0.6) if r.gold == "true" else (0.2 if i % 2 else 0.4)]
    ]  # fmt: skip


def _choice_subset(n: int) -> list[dict]:
    records = spread(load_sample("ag_news"), n)
    return [
        {
            "id": r.id, "split": "test", "domain": "news", "family": f"desk-{i // 4}", "source_family": "ag_news",
            "input": {"state": {"article": r.text}, "questions": {"topic": TASKS["ag_news"].question()}},
            "reference": {"target": r.gold},
        }
        for i, r in enumerate(records)
    ]  # fmt: skip


def _suite(root: Path, n: int = 8) -> Path:
    write_subset(root, "sentiment-score", _score_subset(n))
    write_subset(root, "irony-votes", _distribution_subset(n))
    # named as the published subset whose checksum is known: these bytes cannot match it
    write_subset(root, "vitaminc-dev", _choice_subset(n))
    return root


@pytest.fixture(scope="module")
def scorecard_run(local_engine, tmp_path_factory) -> tuple[Path, Path]:
    """A real run of the small suite on the embedded engine (24 reads), mismatch allowed."""
    data = _suite(tmp_path_factory.mktemp("suite"))
    out = tmp_path_factory.mktemp("suite-run") / "run"
    asyncio.run(run_suite(local_engine, data, out, allow_mismatch=True))
    return data, out


def test_a_published_checksum_mismatch_refuses_by_default(local_engine, tmp_path):
    data = _suite(tmp_path / "suite", n=2)
    with pytest.raises(
        RunRefused,
        match=r"vitaminc-dev/all.jsonl has sha256 \w+, the published table says 6144a345.*--allow-mismatch",
    ):
        load_suite(data)
    with pytest.raises(RunRefused, match="allow-mismatch"):
        asyncio.run(run_suite(local_engine, data, tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # refused before anything was read or written
    records, checks = load_suite(data, allow_mismatch=True)
    assert (
        checks["vitaminc-dev"]["status"] == "mismatch"
        and checks["irony-votes"]["status"] == "unknown"
        and len(records) == 6
    )
    # the same bytes against a table that publishes them: verified
    table = {"vitaminc-dev": checks["vitaminc-dev"]["sha256"]}
    assert load_suite(data, published=table)[1]["vitaminc-dev"]["status"] == "verified"
    # a subset whose file no longer matches its own manifest is a mismatch too
    path = data / "irony-votes" / "all.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"tweets"', b'"tweet"'))
    with pytest.raises(RunRefused, match=r"irony-votes/all.jsonl has sha256 \w+, its manifest says"):
        load_suite(data, published=table)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("family"), r"line 1: no 'family'"),
        (lambda r: r["reference"].pop("target"), r"line 1 \(id '.+'\): no reference.target"),
        (
            lambda r: r["reference"].update(target=7),
            r"reference.target: a score answer is a level from 0 to 4, not 7",
        ),
        (
            lambda r: r["reference"].update(distribution={"0": 1.0}),
            r"reference.distribution must give each of \['0', '1', '2', '3', '4'\]",
        ),
        (
            lambda r: r["reference"].update(distribution=dict.fromkeys("01234", 0.3)),
            "non-negative numbers summing to 1",
        ),
        (lambda r: r["input"].update(questions={}), "input is not a Jev request"),
        (
            lambda r: r["input"]["questions"].update(again=r["input"]["questions"]["rating"]),
            "one question per record expected",
        ),
    ],
)
def test_records_breaking_the_contract_are_refused_by_field(tmp_path, change, message):
    records = _score_subset(2)
    change(records[0])
    write_subset(tmp_path, "sentiment-score", records)
    with pytest.raises(RunRefused, match=message):
        load_suite(tmp_path)


def test_duplicate_ids_bad_lines_and_counts_are_refused(tmp_path):
    records = _choice_subset(3)
    write_subset(tmp_path, "news", [*records, records[0]])
    with pytest.raises(RunRefused, match="id .* appears twice"):
        load_suite(tmp_path)
    write_subset(tmp_path, "news", records)
    manifest = json.loads((tmp_path / "news" / "manifest.json").read_text())
    (tmp_path / "news" / "manifest.json").write_text(json.dumps(manifest | {"count": 4}))
    with pytest.raises(RunRefused, match="manifest.json count is 4, all.jsonl holds 3"):
        load_suite(tmp_path)
    (tmp_path / "news" / "manifest.json").write_text("{")
    with pytest.raises(RunRefused, match="news/manifest.json: not JSON"):
        load_suite(tmp_path)
    (tmp_path / "news" / "all.jsonl").write_text('{"id": 1,\n')
    (tmp_path / "news" / "manifest.json").unlink()
    with pytest.raises(RunRefused, match="news/all.jsonl line 1: not JSON"):
        load_suite(tmp_path, allow_unverified=True)


# -- the scorecard of a real run


@pytest.mark.slow  # 24 reads on the embedded model
def test_scorecard_of_a_real_run(scorecard_run):
    _, out = scorecard_run
    report = score_suite(out, resamples=300)
    rows = load_rows(out)
    assert len(rows) == 24 and report["errors"] == 0 and all(row["status"] == "ok" for row in rows)
    by_subset = {
        s: [row for row in rows if row["subset"] == s]
        for s in ("sentiment-score", "irony-votes", "vitaminc-dev")
    }
    accuracy = {
        s: np.mean([row["predicted"] == row["gold"] for row in mine]) for s, mine in by_subset.items()
    }

    # pooled over records and macro over subsets, overall and per question type
    overall = report["overall"]
    assert overall["n"] == 24 and overall["subsets"] == 3
    assert overall["accuracy"] == pytest.approx(np.mean([row["predicted"] == row["gold"] for row in rows]))
    assert overall["macro_accuracy"] == pytest.approx(np.mean(list(accuracy.values())))
    assert set(report["question_types"]) == {"score", "noul", "choice"}
    assert report["question_types"]["score"]["macro_accuracy"] == pytest.approx(accuracy["sentiment-score"])
    # Jev's figures only where every subset of the group is a published one
    assert "jev_accuracy" in report["question_types"]["choice"] and "jev_accuracy" not in overall

    # the score subset: MAE and Spearman of the expected level, recomputed from the rows
    score = report["subsets"]["sentiment-score"]
    p, gold = rows_arrays(by_subset["sentiment-score"])
    expected = p @ np.arange(5)
    assert sorted(set(gold.tolist())) == [0, 1, 3, 4]  # both target encodings were read
    assert score["mae"] == pytest.approx(np.mean(np.abs(expected - gold)))
    assert score["spearman"] == pytest.approx(spearmanr(expected, gold).statistic)
    assert score["families"] == 4 and 0 <= score["families_complete"] <= 4
    assert "js_divergence_bits" not in score

    # the distribution subset: the model's P(true) against the human share
    votes = report["subsets"]["irony-votes"]
    p_true = np.array([row["probabilities"]["true"] for row in by_subset["irony-votes"]])
    human = np.array([row["distribution"]["true"] for row in by_subset["irony-votes"]])
    assert votes["total_variation"] == pytest.approx(np.mean(np.abs(p_true - human)))
    assert 0 < votes["js_divergence_bits"] < 1 and "mae" not in votes

    # family-clustered 95% ranges around every figure, reproducible for a seed
    figures = [
        (overall, "accuracy"),
        (overall, "macro_accuracy"),
        (score, "accuracy"),
        (score, "mae"),
        (score, "ece"),
        (score, "brier"),
        (votes, "total_variation"),
    ]
    for entry, metric in figures:
        lo, hi = entry[f"{metric}_family_ci95"]
        assert lo <= hi and lo <= entry[metric] + 1e-9 and entry[metric] - 1e-9 <= hi
    assert report["bootstrap"] == {
        "resamples": 300,
        "seed": 0,
        "cluster": "family, resampled within each subset",
        "interval": "percentile 2.5-97.5",
    }
    assert score_suite(out, resamples=300) == report

    # the checksum checks travel with the run
    assert (
        report["subsets"]["vitaminc-dev"]["checksum"] == "mismatch"
        and report["subsets"]["irony-votes"]["checksum"] == "unknown"
    )
    table = suite_table(report)
    assert "| all | 3 | 24 |" in table and "| sentiment-score | 8 | " in table
    assert "Jensen–Shannon divergence, bits" in table and "0 verified, 1 mismatch, 2 unknown" in table


@pytest.mark.slow  # the embedded model loads twice; the run's 24 reads are resumed, not redone
def test_the_command_refuses_a_mismatch_and_scores_with_the_flag(scorecard_run, tmp_path):
    from typer.testing import CliRunner

    from eval.cli import app

    data, out = scorecard_run
    out = copy_run(out, tmp_path)
    runner = CliRunner()
    timings = timings_path(out / RECORDS).read_bytes()
    refused = runner.invoke(app, ["eval", "suite", "--data", str(data), "--out", str(out)])
    assert refused.exit_code == 1 and "refused: vitaminc-dev/all.jsonl has sha256" in refused.output
    scored = runner.invoke(
        app,
        ["eval", "suite", "--data", str(data), "--out", str(out), "--allow-mismatch", "--resamples", "50"],
    )
    assert scored.exit_code == 0, scored.output
    # resumed: nothing read again (a read would have a new decision id in the timings)
    assert timings_path(out / RECORDS).read_bytes() == timings and len(load_rows(out)) == 24
    report = json.loads((out / "suite.json").read_text())
    assert (
        report["bootstrap"]["resamples"] == 50 and report["subsets"]["vitaminc-dev"]["checksum"] == "mismatch"
    )
    assert (out / "suite.md").read_text() == suite_table(report) and "| all | 3 | 24 |" in scored.output
