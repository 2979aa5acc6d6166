"""``decide eval calibration-modes`` on evidence made here: reads that lean towards one option."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eval.decisions.calibration_modes import PRIORS, calibration_modes, measure_priors
from eval.decisions.tasks import TASKS, load_sample
from eval.evidence.manifest import write_json
from eval.evidence.rows import RECORDS, write_rows
from readers.prompt import PROMPT_VERSION

pytestmark = pytest.mark.anyio
LEAN = 6.0  # every read multiplies the first option's weight by this, whatever the text


def leaning_run(path, version: str = PROMPT_VERSION) -> None:
    """200 ag_news records: informative but leaning reads (the gold option's weight ×3, the first
    option's ×LEAN), the case a per-option bias or a divided-out prior corrects."""
    rng = np.random.default_rng(4)
    options = list(TASKS["ag_news"].options)
    lines = []
    for record in load_sample("ag_news")[:200]:
        weights = (
            rng.dirichlet(np.ones(4))
            * np.where(np.array(options) == record.gold, 3.0, 1.0)
            * np.array([LEAN, 1, 1, 1])
        )
        probabilities = dict(zip(options, (weights / weights.sum()).tolist()))
        lines.append(json.dumps({"id": record.id, "task": "ag_news", "variant": "original", "gold": record.gold, "options": options,
                                 "status": "ok", "probabilities": probabilities, "reading": {"raw_probabilities": probabilities}, "latency_ms": 1.0,
                                 "predicted": max(probabilities, key=probabilities.get)}))  # fmt: skip
    path.mkdir()
    run = {"kind": "local", "model": "m", "revision": "r"}
    write_json(
        path / "manifest.json",
        {
            "engines": {"run": run},
            "prompt_version": version,
            "status": "success",
            "args": {"tasks": ["ag_news"]},
        },
    )
    write_rows(path / RECORDS, map(json.loads, lines))


def measured_prior(out, version: str = PROMPT_VERSION) -> None:
    """What content-free reads of a model with that lean give: the lean alone."""
    prior = dict(zip(TASKS["ag_news"].options, (np.array([LEAN, 1, 1, 1]) / (LEAN + 3)).tolist()))
    out.mkdir(exist_ok=True)
    write_json(
        out / PRIORS,
        {
            "prompt_version": version,
            "model": "m",
            "revision": "r",
            "tasks": {"ag_news": {"prior": prior, "states": ["", "N/A"]}},
        },
    )


async def test_bias_and_prior_undo_a_lean_and_every_ece_has_its_floor(tmp_path):
    leaning_run(tmp_path / "run")
    measured_prior(tmp_path / "out")
    report = await calibration_modes(tmp_path / "run", tmp_path / "out", engine=None, splits=5)
    scored = report["tasks"]["ag_news"]
    assert scored["n"] == 200 and set(scored) == {
        "n",
        "raw",
        "temperature",
        "temperature_bias",
        "prior",
        "prior_temperature",
        "state_prior",
    }
    assert scored["temperature"]["accuracy"] == scored["raw"]["accuracy"]  # T never moves the top option
    assert scored["temperature_bias"]["accuracy"] > scored["raw"]["accuracy"] + 0.05
    assert scored["prior"]["accuracy"] > scored["raw"]["accuracy"] + 0.1
    assert (
        scored["prior_temperature"]["accuracy"] == scored["prior"]["accuracy"]
    )  # T on the corrected reads keeps their top option
    assert (
        scored["state_prior"]["accuracy"] > scored["raw"]["accuracy"] + 0.1
    )  # the lean, found from the states alone
    for mode in ("raw", "temperature", "temperature_bias", "prior", "prior_temperature", "state_prior"):
        lo, hi = scored[mode]["ece_floor_range"]
        assert 0 <= lo < scored[mode]["ece_floor"] < hi
    table = (tmp_path / "out" / "modes.md").read_text()
    assert "| ag_news | 200 | prior |" in table and "| ag_news | 200 | state_prior |" in table
    # a choice task has no levels: no cumulative fit, no MAE or Spearman, and the table says so
    assert "| ag_news | 200 | cumulative_logit | — | — | — | — | — | — |" in table
    assert all("mae_expected_level" not in scored[mode] for mode in scored if mode != "n")


async def test_a_prior_is_never_applied_across_prompt_versions(tmp_path):
    leaning_run(tmp_path / "run", version="decide-prompt/2")  # a layout the code no longer has
    report = await calibration_modes(tmp_path / "run", tmp_path / "out", engine="local", splits=2)
    assert (
        not {"prior", "prior_temperature"} & set(report["tasks"]["ag_news"])
        and "decide-prompt/2" in report["prior_note"]
    )  # no engine was opened
    assert "state_prior" in report["tasks"]["ag_news"]  # fitted on the run's own reads: no engine, any layout
    measured_prior(tmp_path / "out")  # measured under this code's version, the run under another
    with pytest.raises(ValueError, match="measured under"):
        await calibration_modes(tmp_path / "run", tmp_path / "out", engine=None, splits=2)
    with pytest.raises(ValueError, match="need 250"):
        await calibration_modes(tmp_path / "run", tmp_path / "other", engine=None, gold=150)


@pytest.mark.slow  # a run per layout
async def test_a_prior_is_measured_under_the_runs_own_layout():
    """A run read under an earlier layout gets its prior from that layout's prompts, not the current one's."""
    old = await measure_priors(
        "local", ["sst2"], prompt_version="decide-prompt/1", label_styles=["words", "codes"]
    )
    new = await measure_priors("local", ["sst2"])
    assert (old["prompt_version"], new["prompt_version"]) == ("decide-prompt/1", PROMPT_VERSION)
    assert old["tasks"]["sst2"]["prior"] != pytest.approx(new["tasks"]["sst2"]["prior"], abs=1e-3)


def score_run(path) -> None:
    """200 sst5 records read one level too high and too sure: 0.85 on the level above a noisy
    reading of the gold level (the top level stays put), the rest spread evenly."""
    rng = np.random.default_rng(5)
    options = list(TASKS["sst5"].options)
    rows = []
    for record in load_sample("sst5")[:200]:
        seen = int(np.clip(np.round(int(record.gold) + rng.normal(0, 0.4)) + 1, 0, 4))
        p = np.full(5, 0.15 / 4)
        p[seen] = 0.85
        probabilities = dict(zip(options, p.tolist()))
        rows.append({"id": record.id, "task": "sst5", "variant": "original", "gold": record.gold, "options": options,
                     "status": "ok", "probabilities": probabilities, "reading": {"raw_probabilities": probabilities},
                     "latency_ms": 1.0, "predicted": max(probabilities, key=probabilities.get)})  # fmt: skip
    path.mkdir()
    run = {"kind": "local", "model": "m", "revision": "r"}
    manifest = {
        "engines": {"run": run},
        "prompt_version": PROMPT_VERSION,
        "status": "success",
        "args": {"tasks": ["sst5"]},
    }
    write_json(path / "manifest.json", manifest)
    write_rows(path / RECORDS, rows)


async def test_score_tasks_get_the_cumulative_fit_and_level_figures_per_mode(tmp_path):
    score_run(tmp_path / "run")
    report = await calibration_modes(tmp_path / "run", tmp_path / "out", engine=None, splits=5)
    scored = report["tasks"]["sst5"]
    assert set(scored) == {"n", "raw", "temperature", "temperature_bias", "cumulative_logit", "state_prior"}
    raw, cumulative = scored["raw"], scored["cumulative_logit"]
    # the lean undone: the fitted thresholds move every read down a level
    assert cumulative["mae_expected_level"] < 0.75 * raw["mae_expected_level"]
    assert cumulative["accuracy"] > raw["accuracy"] + 0.15 and cumulative["ece"] < raw["ece"] / 2
    for mode in ("raw", "temperature", "temperature_bias", "cumulative_logit", "state_prior"):
        assert 0 < scored[mode]["spearman"] <= 1 and scored[mode]["mae_expected_level"] > 0
    line = next(
        line
        for line in (tmp_path / "out" / "modes.md").read_text().splitlines()
        if "| cumulative_logit |" in line
    )
    assert line.endswith(f"| {cumulative['mae_expected_level']:.3f} | {cumulative['spearman']:.3f} |")
