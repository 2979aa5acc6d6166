"""``decide eval calibration-modes RUN``: the calibration modes compared on a run's per-record rows.

Per task (original option order, reads that succeeded): ``splits`` seeded random splits, each fitting
on ``gold`` records with their gold answers and scoring ``held_out`` others, in four modes:

- ``raw``: the read's probabilities;
- ``temperature``: T fitted on the gold answers (``calibration.temperature``);
- ``temperature_bias``: T and per-option biases fitted on the gold answers (``calibration.bias``);
- ``cumulative_logit`` (score tasks only): ordered thresholds and a slope on the read's expected level,
  fitted on the gold levels (``calibration.ordinal``); not a service mode (yet): it is evaluated here
  so a dev run can choose it;
- ``prior``: no gold answers; the question's option prior, read on content-free states through the engine
  under the run's prompt version, divided out (``service.pipeline.prior``);
- ``state_prior``: no gold answers; the mean of the reads of the same ``gold`` records' states divided
  out (``calibration.bias.StatePriorScaler``: what ``POST /v1/calibrations`` fits in that mode).

Reported per mode: mean held-out accuracy (and its standard deviation over splits), mean ECE (15
bins) and, beside it, the mean over splits of the ECE floor of that mode's held-out probabilities
(``calibration.metrics.ece_floor``: median and 95% range of the ECE perfectly calibrated draws
show at the same n and bins). Score tasks also get the held-out MAE of the expected level and its
Spearman correlation with the gold level, each the mean over splits (Spearman over the splits where it
is defined; None where none is); other tasks show "—" there, and on the ``cumulative_logit`` row. The prior needs reads the run does not hold: they are made once (12
reads for the four tasks) and kept in ``priors.json`` beside the report; they are made only when the
run's prompt version is this code's, since a prior measured under another layout does not apply.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from calibration.bias import (
    CONTENT_FREE_STATES,
    StatePriorScaler,
    TemperatureBiasScaler,
    apply_prior,
    apply_temperature_bias,
)
from calibration.metrics import N_BINS, ece, ece_floor, level_absolute_error, level_spearman_score
from calibration.ordinal import CumulativeLogitScaler
from calibration.temperature import TemperatureScaler, apply_temperature, as_logits
from eval.decisions.tasks import TASKS
from eval.evidence.manifest import MANIFEST, write_json
from eval.evidence.rows import RECORDS, load_rows, raw_probabilities, rows_arrays
from readers.prompt import PROMPT_LAYOUTS, PROMPT_VERSION

# Calibration modes (calibration.store.CALIBRATION_MODES), the baselines compared against them, and
# cumulative_logit, a candidate the service does not offer.
EVALUATED_MODES = (
    "raw",
    "temperature",
    "temperature_bias",
    "cumulative_logit",
    "prior",
    "prior_temperature",
    "state_prior",
)
"""``prior_temperature``: the prior divided out, then a temperature fitted on the corrected reads (what
a feedback refit of a choice key gives under the service's default prior correction)."""
NEEDS_PRIOR = ("prior", "prior_temperature")
SCORE_ONLY = ("cumulative_logit",)
"""Modes that use the order of a score's levels: no figures for choice and noul tasks."""
PRIORS = "priors.json"


def task_rows(rows: list[dict], task: str) -> list[dict]:
    return [
        row for row in rows if row["task"] == task and row["variant"] == "original" and row["status"] == "ok"
    ]


def evaluate_task(
    p: np.ndarray,
    y: np.ndarray,
    prior: np.ndarray | None,
    *,
    gold: int = 50,
    held_out: int = 100,
    splits: int = 20,
    seed: int = 0,
    question_type: str = "choice",
) -> dict:
    """Accuracy, ECE and ECE floor per mode, over ``splits`` random (gold, held_out) splits; for a
    ``score`` question also the expected level's MAE and Spearman, and the ``cumulative_logit`` mode."""
    if len(y) < gold + held_out:
        raise ValueError(
            f"{len(y)} records; {gold} with gold answers and {held_out} held out need {gold + held_out}"
        )
    logits = as_logits(p)
    rng = np.random.default_rng(seed)
    ordinal = question_type == "score"
    per_mode: dict[str, list[dict]] = {
        mode: []
        for mode in EVALUATED_MODES
        if (mode not in NEEDS_PRIOR or prior is not None) and (mode not in SCORE_ONLY or ordinal)
    }
    corrected = as_logits(apply_prior(p, prior)) if prior is not None else None
    for split in range(splits):
        order = rng.permutation(len(y))
        fit, held = order[:gold], order[gold : gold + held_out]
        temperature = TemperatureScaler().fit(logits[fit], y[fit]).temperature_
        bias = TemperatureBiasScaler().fit(logits[fit], y[fit])
        calibrated = {
            "raw": p[held],
            "temperature": apply_temperature(logits[held], temperature),
            "temperature_bias": apply_temperature_bias(logits[held], bias.temperature_, bias.bias_),
            "state_prior": StatePriorScaler()
            .fit(logits[fit])
            .predict_proba(logits[held]),  # the fit records' states, not their gold answers
        }
        if ordinal:
            cumulative = CumulativeLogitScaler().fit(logits[fit], y[fit])
            calibrated["cumulative_logit"] = cumulative.predict_proba(logits[held])
        if corrected is not None:
            calibrated["prior"] = np.exp(corrected[held])
            on_corrected = TemperatureScaler().fit(corrected[fit], y[fit]).temperature_
            calibrated["prior_temperature"] = apply_temperature(corrected[held], on_corrected)
        for mode, q in calibrated.items():
            floor = ece_floor(q, N_BINS, seed=seed + split)
            per_mode[mode].append(
                {
                    "accuracy": float(np.mean(q.argmax(axis=1) == y[held])),
                    "ece": ece(q, y[held], N_BINS),
                    "floor": floor,
                    **(
                        {
                            "mae": level_absolute_error(q, y[held]),
                            "spearman": level_spearman_score(q, y[held]),
                        }
                        if ordinal
                        else {}
                    ),
                }
            )
    return {
        mode: {
            **(_ordinal_means(scored) if ordinal else {}),
            "accuracy": float(np.mean([s["accuracy"] for s in scored])),
            "accuracy_sd": float(np.std([s["accuracy"] for s in scored])),
            "ece": float(np.mean([s["ece"] for s in scored])),
            "ece_floor": float(np.mean([s["floor"]["median"] for s in scored])),
            "ece_floor_range": [
                float(np.mean([s["floor"]["lo"] for s in scored])),
                float(np.mean([s["floor"]["hi"] for s in scored])),
            ],
            "splits_above_floor_range": int(sum(s["ece"] > s["floor"]["hi"] for s in scored)),
        }
        for mode, scored in per_mode.items()
    }


def _ordinal_means(scored: list[dict]) -> dict:
    """Mean held-out MAE over the splits, and mean Spearman over those where it is defined (None if none)."""
    spearman = [s["spearman"] for s in scored if not np.isnan(s["spearman"])]
    return {
        "mae_expected_level": float(np.mean([s["mae"] for s in scored])),
        "spearman": float(np.mean(spearman)) if spearman else None,
    }


async def measure_priors(
    engine_spec: str,
    tasks: list[str],
    *,
    engine_url: str | None = None,
    prompt_version: str = PROMPT_VERSION,
    label_styles: list[str] | None = None,
) -> dict:
    """Each task's option prior on the content-free states, read through ``engine_spec`` now, under
    the run's prompt layout and label styles (a prior applies only to reads made the same way)."""
    from readers.engines import open_engine_spec
    from readers.prompt import LabelStyle, prompt_layout
    from readers.reader import Reader
    from service.pipeline.prior import measure_prior
    from service.protocol import SystemOneRequest

    priors = {}
    async with await open_engine_spec(engine_spec, engine_url=engine_url) as engine:
        styles = None if label_styles is None else [LabelStyle(style) for style in label_styles]
        reader = Reader(engine, label_styles=styles, layout=prompt_layout(prompt_version))
        for task in tasks:
            question = SystemOneRequest.model_validate(
                {"state": "", "questions": {"q": TASKS[task].question()}}
            ).questions["q"]
            spec = question.to_spec()
            measured = await measure_prior(reader, spec, CONTENT_FREE_STATES)
            if measured is not None:  # else no label came back on any content-free state: no prior column
                priors[task] = {
                    "prior": dict(zip(spec.options, measured.prior)),
                    "states": list(measured.states),
                }
        info = {"model": engine.info.name, "revision": engine.info.revision}
    return {"prompt_version": prompt_version, **info, "tasks": priors}


async def calibration_modes(
    run: Path, out: Path, *, engine: str | None = "local", engine_url: str | None = None, gold: int = 50, held_out: int = 100,
    splits: int = 20, seed: int = 0,
) -> dict:  # fmt: skip
    """Evaluate the modes on ``run``'s rows; write modes.json, modes.md (and priors.json) into ``out``."""
    manifest = json.loads((run / MANIFEST).read_text())
    rows = load_rows(run / RECORDS)
    tasks = [task for task in manifest["args"]["tasks"] if task_rows(rows, task)]
    run_version = manifest.get("prompt_version")
    model = manifest["engines"]["run"]
    priors, prior_note = None, None
    out.mkdir(parents=True, exist_ok=True)
    if (out / PRIORS).is_file():
        priors = json.loads((out / PRIORS).read_text())
    elif engine is None:
        prior_note = "no engine given: the prior was not measured"
    elif run_version not in PROMPT_LAYOUTS:
        prior_note = f"the run was read under {run_version}, a layout this code no longer has: a prior measured now would not apply"
    else:
        priors = await measure_priors(
            engine,
            tasks,
            engine_url=engine_url,
            prompt_version=run_version,
            label_styles=manifest["args"].get("label_styles"),
        )
        write_json(out / PRIORS, priors)
    if priors is not None and (priors["prompt_version"], priors["model"], priors["revision"]) != (
        run_version,
        model["model"],
        model["revision"],
    ):
        raise ValueError(
            f"{out / PRIORS} was measured under {priors['prompt_version']} on {priors['model']}, not the run's {run_version} on {model['model']}"
        )
    report = {
        "run": str(run), "prompt_version": run_version, "model": model["model"], "revision": model["revision"], "n_bins": N_BINS,
        "gold": gold, "held_out": held_out, "splits": splits, "seed": seed, "prior_note": prior_note, "tasks": {},
    }  # fmt: skip
    for task in tasks:
        ok = task_rows(rows, task)
        p, y = rows_arrays(ok, raw_probabilities)  # every mode starts from the model's own read
        prior = None
        if priors is not None and task in priors["tasks"]:
            prior = np.array([priors["tasks"][task]["prior"][option] for option in ok[0]["options"]])
        report["tasks"][task] = {
            "n": len(ok),
            **evaluate_task(
                p,
                y,
                prior,
                gold=gold,
                held_out=held_out,
                splits=splits,
                seed=seed,
                question_type=TASKS[task].question_type,
            ),
        }
    write_json(out / "modes.json", report)
    (out / "modes.md").write_text(modes_table(report))
    return report


def modes_table(report: dict) -> str:
    lines = [
        (
            f"Model {report['model']} @ {report['revision']}, prompt {report['prompt_version']}; {report['splits']} random splits per task, "
            f"{report['gold']} gold answers fit, {report['held_out']} held out; ECE over {report['n_bins']} bins, mean over splits; "
            "floor = mean over splits of the median ECE of perfectly calibrated draws at the same n (95% range)."
        ),
        "",
        "| task | n | mode | accuracy (sd) | ECE | ECE floor (95% range) | splits above the range | MAE, expected level | Spearman |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, scored in report["tasks"].items():
        for mode in EVALUATED_MODES:
            if mode not in scored:
                if mode in SCORE_ONLY:  # said, not left out: the mode exists, this task has no levels
                    lines.append(f"| {task} | {scored['n']} | {mode} |" + " — |" * 6)
                continue
            s = scored[mode]
            lo, hi = s["ece_floor_range"]
            mae = f"{s['mae_expected_level']:.3f}" if "mae_expected_level" in s else "—"
            spearman = "—" if s.get("spearman") is None else f"{s['spearman']:.3f}"
            lines.append(
                f"| {task} | {scored['n']} | {mode} | {s['accuracy']:.1%} ({s['accuracy_sd']:.1%}) | {s['ece']:.3f} | "
                f"{s['ece_floor']:.3f} ({lo:.3f}–{hi:.3f}) | {s['splits_above_floor_range']} of {report['splits']} | {mae} | {spearman} |"
            )
    if report["prior_note"]:
        lines += ["", f"Prior correction not evaluated: {report['prior_note']}."]
    return "\n".join(lines) + "\n"
