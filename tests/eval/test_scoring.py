"""Scoring and comparison functions against hand-computed values."""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pytest

import eval.decisions.score
from eval.decisions.compare import ComparisonRefused, compare_runs, mcnemar_exact, paired_bootstrap
from eval.decisions.score import at_top_k_bound, wilson_interval
from eval.evidence.rows import RECORDS, write_rows


def test_doctests():
    assert doctest.testmod(eval.decisions.score).failed == 0


def test_wilson_interval_hand_computed():
    # n = 100, 50 successes: centre 0.5, half-width z·sqrt(0.25/100 + z²/40000)/(1 + z²/100)
    z = 1.959963984540054
    half = z * math.sqrt(0.0025 + z * z / 40000) / (1 + z * z / 100)
    assert wilson_interval(50, 100) == pytest.approx((0.5 - half, 0.5 + half))
    lo, hi = wilson_interval(0, 20)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(z * z / 20 / (1 + z * z / 20))


def test_missing_labels_move_to_the_top_k_bound():
    row = {
        "options": ["a", "b"],
        "probabilities": {"a": 0.99, "b": 0.01},
        "reading": {"floor_logprob": -8.0, "label_logprobs": {"a": -1.0, "b": None}},
    }
    bounded = at_top_k_bound(row)  # b at −3 (floor −8 plus the offset 5)
    assert bounded["b"] == pytest.approx(math.exp(-3) / (math.exp(-1) + math.exp(-3)))


def test_paired_bootstrap_on_known_data():
    a = np.array([1] * 70 + [0] * 30)
    b = np.array([1] * 80 + [0] * 20)  # B right on every record A is, plus ten more
    difference, lo, hi = paired_bootstrap(a, b)
    assert difference == pytest.approx(0.10)
    # the paired difference is a mean of 100 draws of {0, 1} with p = 0.1: sd ≈ 0.03
    assert lo == pytest.approx(0.10 - 1.96 * 0.03, abs=0.015) and hi == pytest.approx(
        0.10 + 1.96 * 0.03, abs=0.015
    )
    assert paired_bootstrap(a, b) == (difference, lo, hi)  # fixed seed: reproducible
    same = paired_bootstrap(a, a)
    assert same == (0.0, 0.0, 0.0)


def test_mcnemar_exact():
    a = np.array([True] * 10 + [False] * 2 + [True] * 5)
    b = np.array([False] * 10 + [True] * 2 + [True] * 5)
    result = mcnemar_exact(a, b)
    assert (result["only_a_right"], result["only_b_right"]) == (10, 2)
    assert result["p_value"] == pytest.approx(2 * sum(math.comb(12, k) for k in range(3)) / 2**12)


def test_compare_refuses_different_records_or_gold(tmp_path):
    write_run(tmp_path / "a", correct=[1, 1, 0, 0])
    write_run(tmp_path / "b", correct=[1, 0, 1])
    with pytest.raises(ComparisonRefused, match="1 only in A"):
        compare_runs(tmp_path / "a", tmp_path / "b")
    write_run(tmp_path / "c", correct=[1, 0, 1, 1], gold="negative")
    with pytest.raises(ComparisonRefused, match="gold answers"):
        compare_runs(tmp_path / "a", tmp_path / "c")


def write_run(path, *, correct, gold="positive", images=None, image_digest=None):
    """A run directory: ``images`` as manifests write them now, or an older manifest's ``image_digest``."""
    path.mkdir()
    manifest = {
        "data_sha256": {"sst2": "x"},
        **({"images": images} if images else {"image_digest": image_digest}),
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    rows = [
        {
            "id": f"sst2-{i}",
            "task": "sst2",
            "variant": "original",
            "status": "ok",
            "gold": gold,
            "predicted": "positive" if ok else "negative",
        }
        for i, ok in enumerate(correct)
    ]
    write_rows(path / RECORDS, rows)


@pytest.mark.parametrize("role", ["engine", "service"])
def test_compare_refuses_other_images_unless_allowed(tmp_path, role):
    same = {"engine": "vllm@sha256:1", "service": "decide@sha256:1"}
    write_run(tmp_path / "a", correct=[1, 1, 0, 0], images=same)
    write_run(tmp_path / "b", correct=[1, 0, 1, 1], images={**same, role: "other@sha256:2"})
    with pytest.raises(ComparisonRefused, match=f"different {role} images"):
        compare_runs(tmp_path / "a", tmp_path / "b")
    report = compare_runs(tmp_path / "a", tmp_path / "b", allow_different_image=True)
    assert report["warnings"] and report["tasks"]["sst2"]["same_label"] == 1
    from eval.decisions.compare import compare_table

    assert compare_table(report).startswith(f"WARNING: the runs were served from different {role} images")


def test_an_older_manifests_image_digest_is_its_engine_image(tmp_path):
    write_run(tmp_path / "old", correct=[1, 0], image_digest="vllm@sha256:1")
    write_run(tmp_path / "new", correct=[1, 0], images={"engine": "vllm@sha256:1", "service": None})
    assert compare_runs(tmp_path / "old", tmp_path / "new")["warnings"] == []
    write_run(tmp_path / "other", correct=[1, 0], images={"engine": "vllm@sha256:2", "service": None})
    with pytest.raises(ComparisonRefused, match="engine images .vllm@sha256:1 vs vllm@sha256:2."):
        compare_runs(tmp_path / "old", tmp_path / "other")


def test_compare_command_refuses_with_exit_code_2(tmp_path):
    from typer.testing import CliRunner

    from opendecide.cli import app

    write_run(tmp_path / "a", correct=[1, 0], images={"engine": "e@sha256:1", "service": "s@sha256:1"})
    write_run(tmp_path / "b", correct=[1, 0], images={"engine": "e@sha256:1", "service": "s@sha256:2"})
    refused = CliRunner().invoke(app, ["eval", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert refused.exit_code == 2 and "different service images" in refused.output
    allowed = CliRunner().invoke(
        app, ["eval", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--allow-different-image"]
    )
    assert allowed.exit_code == 0 and "| sst2 | 2 of 2 |" in allowed.stdout


def write_scored_run(path, tasks: dict[str, list[tuple[dict, str]]]) -> None:
    """A run's evidence made here: per task, (probabilities, gold) per record, reads all succeeded."""
    from eval.evidence.manifest import write_json

    path.mkdir()
    rows = []
    for task, records in tasks.items():
        for i, (probabilities, gold) in enumerate(records):
            rows.append({"id": f"{task}-{i}", "task": task, "variant": "original", "gold": gold, "options": list(probabilities),
                         "status": "ok", "probabilities": probabilities, "latency_ms": 10.0,
                         "reading": {"floor_logprob": None, "exact": True, "informative": True},
                         "predicted": max(probabilities, key=probabilities.get)})  # fmt: skip
    engine = {"kind": "local", "read_mode": "exact", "top_k": None, "model": "m", "revision": "r"}
    write_json(path / "manifest.json", {"engines": {"run": engine}, "status": "success", "args": {"tasks": list(tasks)}, "records": len(rows)})  # fmt: skip
    write_rows(path / RECORDS, rows)


def levels(*p: float) -> dict:
    return {str(level): value for level, value in enumerate(p)}


SST2 = [({"negative": 0.8, "positive": 0.2}, "negative"), ({"negative": 0.3, "positive": 0.7}, "negative")]
# expected levels 2.0, 0.5, 1.4, 0.0 (errors 0, 0.5, 0.4, 1.0); gold median 1 (errors 1, 1, 0, 0)
SST3 = [
    (levels(0, 0, 1), "2"),
    (levels(0.5, 0.5, 0), "0"),
    (levels(0.2, 0.2, 0.6), "1"),
    (levels(1, 0, 0), "1"),
]


def test_score_tasks_get_level_figures_and_other_tasks_report_as_before(tmp_path):
    from eval.decisions.score import score_run, score_table

    write_scored_run(tmp_path / "both", {"sst2": SST2, "sst3": SST3})
    write_scored_run(tmp_path / "choice", {"sst2": SST2})
    both, choice = score_run(tmp_path / "both"), score_run(tmp_path / "choice")
    sst3 = both["tasks"]["sst3"]
    assert sst3["mae_expected_level"] == pytest.approx(1.9 / 4) and sst3["median_level_mae"] == 0.5
    # ranks: expected (4, 2, 3, 1), gold (4, 1, 2.5, 2.5)
    assert sst3["spearman"] == pytest.approx(np.corrcoef([4, 2, 3, 1.0], [4, 1, 2.5, 2.5])[0, 1])
    assert both["tasks"]["sst2"] == choice["tasks"]["sst2"]
    assert not {"mae_expected_level", "median_level_mae", "spearman"} & set(choice["tasks"]["sst2"])
    table = score_table(both)
    assert f"| sst3 | 4 | 50.0% | 0.475 | 0.500 | {sst3['spearman']:.3f} |" in table
    # the choice task's lines are the same: the score task adds its row and a second table after them
    choice_lines = score_table(choice).splitlines()
    kept = [line for line in table.splitlines() if not line.startswith("| sst3 |")]
    assert kept[: len(choice_lines)] == choice_lines and kept[len(choice_lines) + 1].startswith("Score tasks")
    assert "Score tasks" not in score_table(choice)


def test_a_constant_side_leaves_spearman_undefined_not_zero(tmp_path):
    from eval.decisions.score import score_run, score_table

    write_scored_run(tmp_path / "run", {"sst3": [(levels(0.2, 0.3, 0.5), "1"), (levels(0.6, 0.3, 0.1), "1")]})
    report = score_run(tmp_path / "run")
    assert report["tasks"]["sst3"]["spearman"] is None and report["tasks"]["sst3"]["median_level_mae"] == 0.0
    assert score_table(report).rstrip().endswith("| — |")
