"""``decide eval label-styles`` on the embedded model: one run per prompt layout and style set, rows
from its records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eval.decisions.label_styles import label_styles_table, run_dir, run_label_styles
from eval.evidence.rows import RECORDS, load_rows
from readers.prompt import PROMPT_VERSION
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION

pytestmark = pytest.mark.anyio


@pytest.mark.slow  # a run of two style sets over the task's records
async def test_style_sets_run_and_tabulate(local_engine, tmp_path):
    rows = await run_label_styles(
        local_engine, tmp_path, style_sets=["words", "trie"], tasks=["ag_news"], limit=3
    )
    by_set = {row["style_set"]: row for row in rows}
    # "Sci/Tech" is not one token: the words set falls back to codes, the trie set reads the names
    assert by_set["words"]["label_styles_used"] == {"codes": 6}
    assert by_set["trie"]["label_styles_used"] == {"trie": 6}
    for name, row in by_set.items():
        run = run_dir(tmp_path, PROMPT_VERSION, name)
        records = load_rows(run / RECORDS)
        original = {r["id"]: r for r in records if r["variant"] == "original"}
        reversed_ = {r["id"]: r for r in records if r["variant"] == "reversed"}
        assert row["original"]["n"] == 3 and row["paired"] == 3
        assert row["original"]["correct"] == sum(r["predicted"] == r["gold"] for r in original.values())
        assert row["reversed_changes"] == sum(
            original[i]["predicted"] != reversed_[i]["predicted"] for i in original
        )
        assert json.loads((run / "manifest.json").read_text())["args"]["label_styles"][:2] == list(
            {"words": ("words", "codes"), "trie": ("words", "trie")}[name]
        )
    assert json.loads((tmp_path / "label-styles.json").read_text()) == json.loads(json.dumps(rows))
    table = label_styles_table(rows)
    assert (
        f"| trie | {PROMPT_VERSION} | {DEFAULT_PRIOR_CORRECTION} | ag_news | 3 |" in table and "of 3" in table
    )


@pytest.mark.slow  # runs with and without the prior correction
async def test_rows_hold_the_answer_and_the_raw_read_beside_it(local_engine, tmp_path):
    """Runs answer as the service does (choice questions prior-corrected by default); the raw read's
    accuracy is counted from the same rows, and a run without the correction answers raw."""
    rows = await run_label_styles(
        local_engine, tmp_path / "choice", style_sets=["default"], tasks=["ag_news", "irony"], limit=3
    )
    off = await run_label_styles(
        local_engine,
        tmp_path / "off",
        style_sets=["default"],
        tasks=["ag_news"],
        limit=3,
        prior_correction="off",
    )
    records = load_rows(run_dir(tmp_path / "choice", PROMPT_VERSION, "default") / RECORDS)
    for record in records:
        raw, used = record["reading"]["raw_probabilities"], record["reading"]["prior_correction"]
        if record["task"] == "irony":  # yes/no: not covered by the default
            assert used is None and record["probabilities"] == pytest.approx(
                {"true": raw["true"], "false": 1 - raw["true"]}
            )
            continue
        corrected = {option: raw[option] / used["prior"][option] for option in raw}
        total = sum(corrected.values())
        assert record["reading"]["calibration"] is None and record["probabilities"] == pytest.approx(
            {o: p / total for o, p in corrected.items()}
        )
        assert record["predicted"] == max(corrected, key=corrected.__getitem__)
    by_task = {row["task"]: row for row in rows}
    original = [r for r in records if r["task"] == "ag_news" and r["variant"] == "original"]
    raw_right = sum(
        max(r["reading"]["raw_probabilities"], key=r["reading"]["raw_probabilities"].__getitem__) == r["gold"]
        for r in original
    )
    assert (
        by_task["ag_news"]["raw"]["correct"] == raw_right
        and by_task["ag_news"]["corrected"] == 6
        and by_task["irony"]["corrected"] == 0
    )
    assert off[0]["prior_correction"] == "off" and off[0]["corrected"] == 0
    assert (
        off[0]["original"]["correct"] == off[0]["raw"]["correct"] == raw_right
    )  # the same reads, answered raw
    assert f"| default | {PROMPT_VERSION} | off | ag_news | 3 |" in label_styles_table(off)


async def test_unknown_style_set_is_named(local_engine, tmp_path):
    with pytest.raises(ValueError, match="letters"):
        await run_label_styles(local_engine, tmp_path, style_sets=["letters"])


@pytest.mark.slow  # a run per layout
async def test_layouts_side_by_side_in_one_run(local_engine, tmp_path):
    """The before/after comparison of a prompt change: each layout with its own default reads."""
    rows = await run_label_styles(
        local_engine,
        tmp_path,
        style_sets=["default"],
        prompt_versions=["decide-prompt/1", PROMPT_VERSION],
        tasks=["ag_news"],
        limit=2,
    )
    by_version = {row["prompt_version"]: row for row in rows}
    assert set(by_version) == {"decide-prompt/1", PROMPT_VERSION}
    # decide-prompt/1 read one-token names, else one-token codes; the current layout reads whole names
    assert by_version["decide-prompt/1"]["label_styles_used"] == {"codes": 4}
    assert by_version[PROMPT_VERSION]["label_styles_used"] == {"trie": 4}
    for version in by_version:
        manifest = json.loads((run_dir(tmp_path, version, "default") / "manifest.json").read_text())
        assert manifest["prompt_version"] == version
    table = label_styles_table(rows)
    assert (
        f"| default | decide-prompt/1 | {DEFAULT_PRIOR_CORRECTION} | ag_news | 2 |" in table
        and f"| default | {PROMPT_VERSION} | {DEFAULT_PRIOR_CORRECTION} | ag_news | 2 |" in table
    )


async def test_unknown_prompt_version_is_refused_before_reading(local_engine, tmp_path):
    with pytest.raises(ValueError, match="decide-prompt/99"):
        await run_label_styles(
            local_engine, tmp_path, style_sets=["default"], prompt_versions=["decide-prompt/99"]
        )
    assert not any(tmp_path.iterdir())


def test_score_tasks_get_the_answers_level_figures(tmp_path):
    """Rows written here (no engine): sst3's answers get MAE and Spearman, sst2's a dash."""
    from eval.decisions.label_styles import style_rows
    from eval.evidence.manifest import write_json
    from eval.evidence.rows import write_rows

    def row(task, i, probabilities, gold, variant="original"):
        reading = {"raw_probabilities": probabilities, "prior_correction": None, "label_style": "words"}
        return {"id": f"{task}-{i}", "task": task, "variant": variant, "gold": gold, "options": list(probabilities), "status": "ok",
                "probabilities": probabilities, "reading": reading, "predicted": max(probabilities, key=probabilities.get)}  # fmt: skip

    # expected levels 2.0, 0.5, 1.4, 0.0 against gold 2, 0, 1, 1: errors 0, 0.5, 0.4, 1.0
    sst3 = [([0, 0, 1], "2"), ([0.5, 0.5, 0], "0"), ([0.2, 0.2, 0.6], "1"), ([1, 0, 0], "1")]
    rows = [row("sst3", i, dict(zip("012", p)), gold) for i, (p, gold) in enumerate(sst3)]
    sst2 = {"negative": 0.8, "positive": 0.2}
    rows += [row("sst2", 0, sst2, "negative"), row("sst2", 0, sst2, "negative", "reversed")]
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / "manifest.json", {"prompt_version": PROMPT_VERSION, "args": {"prior_correction": "off"}})
    write_rows(run / RECORDS, rows)
    by_task = {result["task"]: result for result in style_rows(run, "words")}
    assert by_task["sst2"]["levels"] is None
    figures = by_task["sst3"]["levels"]
    assert figures["mae_expected_level"] == pytest.approx(1.9 / 4)
    # ranks: expected (4, 2, 3, 1), gold (4, 1, 2.5, 2.5)
    assert figures["spearman"] == pytest.approx(np.corrcoef([4, 2, 3, 1.0], [4, 1, 2.5, 2.5])[0, 1])
    table = label_styles_table(list(by_task.values()))
    assert f"| 0.475 | {figures['spearman']:.3f} | words 4 |" in table
    assert "| 0 of 1 (0%) | 100.0% | — | — | words 2 |" in table  # sst2: no levels
