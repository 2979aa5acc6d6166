"""``decide eval few-shot``: which calibration mode a fit on N gold answers should use, per question type.

The gold curve across modes: for each task, ``splits`` seeded splits of its records into a pool half
and a held-out half (``gold_curve.split``), N gold answers drawn from the pool (``gold_curve.draw``,
so a given N uses the same records whatever other N are asked), every mode fitted on them and scored
on the whole held-out half: accuracy, macro-F1 and ECE (15 bins). N = 0 is the read as answered
without a fit. Reads are the service's default reads (:func:`default_read`): the content-free prior
divided out for the types the service corrects (``DEFAULT_PRIOR_CORRECTION``), the model's own read
for the others, so a fit here is fitted on what a service fit is fitted on.

The rule that picks each type's default on the dev split, and the confirmation on the test samples,
are in evidence/few-shot/rule.md, committed before the dev curve was computed; :func:`choose` and
:func:`confirm` implement its steps 1–4 and 5. Round 2 (evidence/few-shot/round-2/rule.md) runs the same
rule over more modes (``ROUNDS``): ``gold_prior`` for reference and ``cv_selected``, the mode chosen
per fit by cross-validation on the fit's own gold answers (calibration/select.py), as a candidate; it
adds the issue's pass check (:func:`done_when`). Round 5 reads a type's ECE as the mean of its tasks'
and confirms on the fresh split, records first read for it (evidence/few-shot/round-5/rule.md). Every
figure comes from committed record rows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from calibration.bias import AffineScaler, GoldPriorScaler, StatePriorScaler, TemperatureBiasScaler
from calibration.metrics import N_BINS, auroc_score, ece, macro_f1_score
from calibration.ordinal import CumulativeLogitScaler
from calibration.probe import PROBE_MEMBERS, ProbeScaler
from calibration.select import CrossValidatedScaler
from calibration.temperature import TemperatureScaler, as_logits
from eval.decisions.gold_curve import draw, split
from eval.decisions.tasks import TASKS
from eval.evidence.manifest import write_json
from eval.evidence.rows import load_rows, raw_probabilities, rows_arrays
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION

QUESTION_TYPES = ("noul", "choice", "score")
MODES = ("temperature", "temperature_bias", "affine", "state_prior", "cumulative_logit")
CANDIDATES = ("temperature", "temperature_bias", "affine")
"""The modes rule step 1 chooses among, simplest first (the tie order of step 3)."""
ROUNDS = {
    1: {"modes": MODES, "candidates": CANDIDATES},
    2: {"modes": MODES + ("gold_prior", "cv_selected"), "candidates": CANDIDATES + ("cv_selected",)},
    3: {"modes": MODES + ("probe",), "candidates": CANDIDATES + ("probe",), "probe_members": 1},
    4: {
        "modes": MODES + ("probe",),
        "candidates": CANDIDATES + ("probe",),
        "probe_members": PROBE_MEMBERS,
        "ece": "pooled_ece",
    },
    5: {
        "modes": MODES + ("probe",),
        "candidates": CANDIDATES + ("probe",),
        "probe_members": PROBE_MEMBERS,
        "ece": "task_ece",
        "confirm_ece": "task_ece",
        "fresh": True,
    },
}
"""Per round of the rule, the modes its curve scores and the candidates it chooses among, simplest
first (round 2: evidence/few-shot/round-2/rule.md; round 3, the probe on the answer slot's hidden
state: evidence/few-shot/round-3/rule.md; round 4, the probe averaged over bootstrap fits and ECE
read over all splits pooled: evidence/few-shot/round-4/rule.md; round 5, a type's ECE the mean of
its tasks' pooled ECEs, confirmed on the fresh split: evidence/few-shot/round-5/rule.md).
``probe_members``: the fits a probe averages (round 3's was one); ``ece``: the ECE figure the rule
and the dev pass check read (``ece``, the mean of the splits', unless named); ``confirm_ece``: the
one a confirmation's type rows read (``ece``, the tasks' reads pooled, unless named); ``fresh``:
the rule also confirms on ``FRESH_RUN``."""
FEATURE_MODES = ("probe",)
"""Modes fitted on the answer slot's hidden state as well as the reads (``eval.decisions.features``)."""
SCORE_ONLY = ("cumulative_logit",)
COUNTS = (0, 4, 8, 16, 32, 50)
FROM_COUNTS = (16, 32, 50)
"""Where a default other than temperature may start (MIN_GOLD is 10: fewer fit nothing)."""
SPLITS = 20
ECE_MARGIN = 0.01
TASK_MARGIN = 0.02
LIFT_TIE = 0.005
RESAMPLES = 2000
DEV_RUNS = {
    "noul": "evidence/reads/dev-reads/decide-prompt-3",
    "choice": "evidence/reads/dev-reads/decide-prompt-4",
    "score": "evidence/reads/dev-reads/decide-prompt-6",
}
"""Committed dev runs holding decide-prompt/7's reads of each type (evidence/few-shot/rule.md)."""
TEST_RUN = "evidence/reads/regression-7/candidate"
FRESH_RUN = "evidence/reads/fresh-7"
"""The fresh split's reads under decide-prompt/7, made once for round 5 (its rule.md)."""

Scaler = (
    TemperatureScaler
    | TemperatureBiasScaler
    | AffineScaler
    | StatePriorScaler
    | CumulativeLogitScaler
    | CrossValidatedScaler
)


def default_read(row: dict) -> dict[str, float]:
    """The probabilities a service answer starts from before any fit: prior-corrected where the
    default policy corrects the row's type (ValueError if the run did not), else the model's own read."""
    if not DEFAULT_PRIOR_CORRECTION.covers(TASKS[row["task"]].question_type):
        return raw_probabilities(row)
    if row["reading"].get("prior_correction") is None:
        raise ValueError(f"{row['task']} {row['id']}: the run did not divide the prior out of this read")
    return row["probabilities"]


def task_rows(rows: Sequence[dict], task: str) -> list[dict]:
    """The task's successful original-order rows, by id: the curve's rows, in its order."""
    return sorted(
        (r for r in rows if r["task"] == task and r["variant"] == "original" and r["status"] == "ok"),
        key=lambda r: r["id"],
    )


def task_reads(rows: Sequence[dict], task: str) -> tuple[np.ndarray, np.ndarray]:
    """Default-read logits and gold indices of :func:`task_rows`."""
    p, gold = rows_arrays(task_rows(rows, task), default_read)
    return as_logits(p), gold


def scaler_for(mode: str) -> Scaler:
    """An unfitted scaler of ``mode`` (``calibration.fit.scaler_for`` plus the eval-only fits)."""
    from calibration.fit import scaler_for as service_scaler

    eval_only = {
        "probe": ProbeScaler,
        "cumulative_logit": CumulativeLogitScaler,
        "gold_prior": GoldPriorScaler,
        "cv_selected": CrossValidatedScaler,
    }
    return eval_only[mode]() if mode in eval_only else service_scaler(mode)


def fitted(
    mode: str,
    logits: np.ndarray,
    gold: np.ndarray,
    fit: np.ndarray,
    features: np.ndarray | None = None,
    *,
    probe_members: int = PROBE_MEMBERS,
) -> Callable[[np.ndarray], np.ndarray]:
    """``mode`` fitted on rows ``fit`` (state_prior: on their states alone; ``FEATURE_MODES`` on their
    hidden states too, a probe averaging ``probe_members`` fits), as a function of the rows to
    predict (indices)."""
    if not len(fit):
        return lambda rows: np.exp(logits[rows] - np.logaddexp.reduce(logits[rows], axis=1, keepdims=True))
    if mode == "state_prior":
        scaler = StatePriorScaler().fit(logits[fit])
    elif mode in FEATURE_MODES:
        if features is None:
            raise ValueError(f"mode {mode} needs the reads' hidden states")
        probe = ProbeScaler(members=probe_members).fit(logits[fit], gold[fit], features[fit])
        return lambda rows: probe.predict_proba(logits[rows], features[rows])
    else:
        scaler = scaler_for(mode).fit(logits[fit], gold[fit])
    return lambda rows: scaler.predict_proba(logits[rows])


def modes_for(question_type: str, modes: Sequence[str] = MODES) -> tuple[str, ...]:
    return tuple(m for m in modes if m not in SCORE_ONLY or question_type == "score")


def mode_curve(
    logits: np.ndarray,
    gold: np.ndarray,
    question_type: str,
    *,
    counts: Sequence[int] = COUNTS,
    splits: int = SPLITS,
    seed: int = 0,
    modes: Sequence[str] = MODES,
    features: np.ndarray | None = None,
    probe_members: int = PROBE_MEMBERS,
) -> dict:
    """Per mode and N: the held-out accuracy, macro-F1 and ECE of every split (lists), the ECE of
    all splits' held-out reads pooled (``pooled_ece``, with its bins' sums, ``pooled``: what a
    type's pooled figure adds up), and the held-out majority rate of every split. ``features``: the
    rows' hidden states (``FEATURE_MODES``)."""
    per: dict[str, dict[int, dict[str, list[float]]]] = {
        mode: {n: {"accuracy": [], "macro_f1": [], "ece": []} for n in counts}
        for mode in modes_for(question_type, modes)
    }
    tops: dict[tuple[str, int], list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    majority = []
    for index in range(splits):
        pool, held = split(len(gold), seed, index)
        majority.append(Counter(gold[held].tolist()).most_common(1)[0][1] / len(held))
        for n in counts:
            fit = draw(pool, n, seed, index)
            for mode, curve in per.items():
                q = fitted(mode, logits, gold, fit, features, probe_members=probe_members)(held)
                curve[n]["accuracy"].append(float(np.mean(q.argmax(axis=1) == gold[held])))
                curve[n]["macro_f1"].append(macro_f1_score(q, gold[held]))
                curve[n]["ece"].append(ece(q, gold[held], N_BINS))
                tops[mode, n].append((q.max(axis=1), q.argmax(axis=1) == gold[held]))
    for (mode, n), parts in tops.items():
        confidence, correct = (np.concatenate(side) for side in zip(*parts, strict=True))
        pooled = {"n": len(confidence), "gap": ece_gaps(confidence, correct).tolist()}
        per[mode][n] |= {"pooled_ece": pooled_ece([pooled]), "pooled": pooled}
    return {"majority": majority, "modes": {m: {str(n): v for n, v in c.items()} for m, c in per.items()}}


def runs_reads(runs: Mapping[str, Path]) -> Iterator[tuple[str, Path, str, np.ndarray, np.ndarray]]:
    """(question type, run, task, logits, gold) of every task of its type that ``runs`` (type → run
    directory) holds rows of."""
    for question_type, run in runs.items():
        rows = load_rows(Path(run))
        for task in TASKS:
            if TASKS[task].question_type == question_type and any(r["task"] == task for r in rows):
                yield question_type, run, task, *task_reads(rows, task)


def curve_report(
    runs: Mapping[str, Path],
    *,
    splits: int = SPLITS,
    seed: int = 0,
    modes: Sequence[str] = MODES,
    features: Mapping[str, np.ndarray] | None = None,
    probe_members: int = PROBE_MEMBERS,
) -> dict:
    """:func:`mode_curve` of every task whose type's run is in ``runs`` (type → run directory), and
    the per-type means (each task counted once) the rule reads. ``features``: per task, its rows'
    hidden states (``FEATURE_MODES``)."""
    tasks = {}
    for question_type, run, task, logits, gold in runs_reads(runs):
        tasks[task] = {"type": question_type, "n": len(gold), "run": str(run)} | mode_curve(
            logits, gold, question_type, splits=splits, seed=seed, modes=modes,
            features=None if features is None else features[task], probe_members=probe_members,
        )  # fmt: skip
    return {"n_bins": N_BINS, "splits": splits, "seed": seed, "counts": list(COUNTS), "tasks": tasks,
            "types": type_means(tasks)}  # fmt: skip


def type_means(tasks: Mapping[str, dict]) -> dict:
    """Per type, mode and N: mean over the type's tasks of each task's split means (lift =
    accuracy − the held-out majority rate), the ECE of the tasks' reads pooled (``pooled_ece``) and
    the mean of each task's own pooled ECE (``task_ece``), and each task's mean accuracy (rule step 2c)."""
    out = {}
    for question_type in QUESTION_TYPES:
        mine = {t: e for t, e in tasks.items() if e["type"] == question_type}
        if not mine:
            continue
        out[question_type] = {"tasks": list(mine), "modes": {}}
        for mode in next(iter(mine.values()))["modes"]:
            out[question_type]["modes"][mode] = {
                n: {
                    "lift": float(
                        np.mean(
                            [
                                np.mean(np.subtract(e["modes"][mode][n]["accuracy"], e["majority"]))
                                for e in mine.values()
                            ]
                        )
                    ),
                    "accuracy": float(
                        np.mean([np.mean(e["modes"][mode][n]["accuracy"]) for e in mine.values()])
                    ),
                    "macro_f1": float(
                        np.mean([np.mean(e["modes"][mode][n]["macro_f1"]) for e in mine.values()])
                    ),
                    "ece": float(np.mean([np.mean(e["modes"][mode][n]["ece"]) for e in mine.values()])),
                    # Every task's held-out reads in one pool, as round 4's confirmation pools them.
                    "pooled_ece": pooled_ece([e["modes"][mode][n]["pooled"] for e in mine.values()]),
                    # Each task's reads pooled on their own, then the tasks' mean (round 5).
                    "task_ece": float(np.mean([e["modes"][mode][n]["pooled_ece"] for e in mine.values()])),
                    "task_accuracy": {
                        t: float(np.mean(e["modes"][mode][n]["accuracy"])) for t, e in mine.items()
                    },
                }  # fmt: skip
                for n in map(str, COUNTS)
            }
    return out


def eligible(modes: Mapping[str, dict], mode: str, n: str, ece_figure: str = "ece") -> bool:
    """Rule step 2 at N = ``n``: ECE (``ece_figure``) within ECE_MARGIN of temperature's, macro-F1
    not below it, and no task's accuracy more than TASK_MARGIN below temperature's."""
    m, t = modes[mode][n], modes["temperature"][n]
    return (
        m[ece_figure] <= t[ece_figure] + ECE_MARGIN
        and m["macro_f1"] >= t["macro_f1"]
        and all(
            m["task_accuracy"][task] >= t["task_accuracy"][task] - TASK_MARGIN for task in t["task_accuracy"]
        )
    )


def choose(
    types: Mapping[str, dict], candidates: Sequence[str] = CANDIDATES, ece_figure: str = "ece"
) -> dict:
    """Rule steps 1–4 over :func:`type_means`: per type, the default mode among ``candidates``
    (simplest first) and the N it starts from, judging ECE by ``ece_figure``."""
    chosen = {}
    for question_type, entry in types.items():
        modes = entry["modes"]
        ok = [m for m in candidates if m == "temperature" or eligible(modes, m, "50", ece_figure)]
        best = max(modes[m]["50"]["lift"] for m in ok)
        tied = [m for m in ok if modes[m]["50"]["lift"] >= best - LIFT_TIE]
        top_f1 = max(modes[m]["50"]["macro_f1"] for m in tied)
        # Ties on macro-F1 to 4 places go to the simpler mode (CANDIDATES order).
        pick = next(
            m for m in candidates if m in tied and round(modes[m]["50"]["macro_f1"], 4) == round(top_f1, 4)
        )
        start = None
        if pick != "temperature":
            holds = {
                n: eligible(modes, pick, str(n), ece_figure)
                and modes[pick][str(n)]["lift"] > modes["temperature"][str(n)]["lift"]
                for n in FROM_COUNTS
            }
            start = next((n for n in FROM_COUNTS if all(holds[m] for m in FROM_COUNTS if m >= n)), None)
            if start is None:  # step 4 finds no N: the mode never holds up to 50
                pick = "temperature"
        chosen[question_type] = {
            "mode": pick,
            "from_n": start,
            "eligible": ok,
            "lift": modes[pick]["50"]["lift"],
        }
    return chosen


def confirm(
    rows: Sequence[dict],
    chosen: Mapping[str, dict],
    *,
    n_gold: int = 50,
    splits: int = SPLITS,
    seed: int = 0,
    resamples: int = RESAMPLES,
    uncalibrated: bool = False,
    features: Mapping[str, np.ndarray] | None = None,
    probe_members: int = PROBE_MEMBERS,
    ece_figure: str = "ece",
    split_name: str = "test",
) -> dict:
    """Rule step 5: temperature against each type's chosen mode after ``n_gold`` gold answers, on the
    held-out halves of ``splits`` splits; pooled over splits, with cluster-bootstrap intervals.
    ``uncalibrated``: also the reads as answered without a fit (round 2's pass check); ``features``:
    per task, its rows' hidden states (a chosen ``FEATURE_MODES`` mode); ``ece_figure``: the ECE a
    row's regression reads, ``ece`` (its tasks' reads pooled) or ``task_ece`` (the mean of its tasks'
    ECEs, round 5); ``split_name``: which split ``rows`` are of, for the tables."""
    held: dict[str, dict] = {}
    for task in TASKS:
        question_type = TASKS[task].question_type
        if question_type not in chosen or not any(r["task"] == task for r in rows):
            continue
        logits, gold = task_reads(rows, task)
        mine = None if features is None else features.get(task)
        record, base, cand, raw = [], [], [], []
        for index in range(splits):
            pool, out = split(len(gold), seed, index)
            fit = draw(pool, n_gold, seed, index)
            record.append(out)
            base.append(fitted("temperature", logits, gold, fit)(out))
            cand.append(
                fitted(chosen[question_type]["mode"], logits, gold, fit, mine, probe_members=probe_members)(
                    out
                )
            )
            raw.append(fitted("temperature", logits, gold, fit[:0])(out))
        record = np.concatenate(record)
        held[task] = {
            "type": question_type, "n": len(gold), "record": record, "gold": gold[record],
            "majority": Counter(gold.tolist()).most_common(1)[0][1] / len(gold),
            "positions": [np.flatnonzero(record == i) for i in range(len(gold))],
            "baseline": np.vstack(base), "candidate": np.vstack(cand),
        } | ({"uncalibrated": np.vstack(raw)} if uncalibrated else {})  # fmt: skip
    groups = {task: [task] for task in held}
    for question_type in QUESTION_TYPES:
        typed = [t for t in held if held[t]["type"] == question_type]
        if typed:
            groups[f"all {question_type}"] = typed
    rng = np.random.default_rng(seed)
    draws = {task: [rng.integers(0, e["n"], e["n"]) for _ in range(resamples)] for task, e in held.items()}
    report = {
        "n_gold": n_gold,
        "splits": splits,
        "seed": seed,
        "resamples": resamples,
        "n_bins": N_BINS,
        "split": split_name,
        "ece_figure": ece_figure,
        "rows": {},
    }
    for name, tasks in groups.items():
        point = _group_metrics(held, tasks, None)
        boot = [_group_metrics(held, tasks, {t: draws[t][i] for t in tasks}) for i in range(resamples)]
        row = {"type": held[tasks[0]]["type"], "tasks": tasks, "n": sum(held[t]["n"] for t in tasks),
               "majority": sum(held[t]["majority"] * held[t]["n"] for t in tasks) / sum(held[t]["n"] for t in tasks),
               "mode": chosen[held[tasks[0]]["type"]]["mode"]}  # fmt: skip
        for metric in ("accuracy", "macro_f1", "ece", "task_ece"):
            for side in point:
                values = [b[side][metric] for b in boot]
                row[f"{side}_{metric}"] = point[side][metric]
                row[f"{side}_{metric}_ci95"] = [float(v) for v in np.percentile(values, [2.5, 97.5])]
            differences = [b["candidate"][metric] - b["baseline"][metric] for b in boot]
            row[f"difference_{metric}"] = point["candidate"][metric] - point["baseline"][metric]
            row[f"difference_{metric}_ci95"] = [float(v) for v in np.percentile(differences, [2.5, 97.5])]
        row["regresses"] = regresses(row, ece_figure)
        report["rows"][name] = row
    report["regresses"] = sorted(name for name, row in report["rows"].items() if row["regresses"])
    return report


def regresses(row: Mapping[str, list[float]], ece_figure: str = "ece") -> bool:
    """Rule step 5 for one row of :func:`confirm`: the accuracy or macro-F1 difference's interval
    lies below zero, or the interval of the ECE difference (``ece_figure``'s) above zero."""
    return bool(
        row["difference_accuracy_ci95"][1] < 0
        or row["difference_macro_f1_ci95"][1] < 0
        or row[f"difference_{ece_figure}_ci95"][0] > 0
    )


def _group_metrics(
    held: Mapping[str, dict], tasks: Sequence[str], resample: Mapping[str, np.ndarray] | None
) -> dict:
    """Accuracy and ECE over the tasks' held-out reads pooled (each task's records resampled as
    given: a record's reads over the splits stay together), macro-F1 and ``task_ece`` (each task's
    reads' ECE) the means of the tasks'."""
    out = {}
    for side in ("baseline", "candidate", "uncalibrated"):
        if side not in held[tasks[0]]:
            continue
        top, right, f1, eces = [], [], [], []
        for task in tasks:
            e = held[task]
            index = (
                np.arange(len(e["record"]))
                if resample is None
                else np.concatenate([e["positions"][i] for i in resample[task]])
            )
            p, y = e[side][index], e["gold"][index]
            f1.append(macro_f1_score(p, y))
            # Top-label figures only: the pooled tasks have different option counts.
            top.append(p.max(axis=1))
            right.append(p.argmax(axis=1) == y)
            eces.append(top_label_ece(top[-1], right[-1]))
        confidence, correct = np.concatenate(top), np.concatenate(right)
        out[side] = {
            "accuracy": float(correct.mean()),
            "ece": top_label_ece(confidence, correct),
            "task_ece": float(np.mean(eces)),
            "macro_f1": float(np.mean(f1)),
        }
    return out


def read_signal(runs: Mapping[str, Path], *, n_gold: int = 50, splits: int = SPLITS, seed: int = 0) -> dict:
    """Per task, how much the default read knows and how well ``n_gold`` gold answers know the class
    balance (round 2's study): gold and answered counts per option, the uncalibrated accuracy and the
    majority rate, each option's one-vs-rest AUROC of its read probability, and in how many of
    ``splits`` splits the drawn gold answers' most common class is not the held-out half's."""
    out = {}
    for question_type, _run, task, logits, gold in runs_reads(runs):
        p = np.exp(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
        k = p.shape[1]
        wrong_majority = 0
        for index in range(splits):
            pool, held = split(len(gold), seed, index)
            drawn = np.bincount(gold[draw(pool, n_gold, seed, index)], minlength=k)
            held_counts = np.bincount(gold[held], minlength=k)
            # A tie among the drawn answers counts as wrong: it names no majority.
            wrong_majority += int((drawn == drawn.max()).sum() > 1 or drawn.argmax() != held_counts.argmax())
        out[task] = {
            "type": question_type, "n": len(gold), "options": list(TASKS[task].options),
            "gold_counts": np.bincount(gold, minlength=k).tolist(),
            "answered_counts": np.bincount(p.argmax(axis=1), minlength=k).tolist(),
            "uncalibrated_accuracy": float(np.mean(p.argmax(axis=1) == gold)),
            "majority": float(np.bincount(gold, minlength=k).max() / len(gold)),
            "auroc": [auroc_score(p[:, i], gold == i) if 0 < (gold == i).sum() < len(gold) else None for i in range(k)],
            "splits": splits, "n_gold": n_gold, "drawn_majority_wrong": wrong_majority,
        }  # fmt: skip
    return out


def signal_table(signal: Mapping[str, dict]) -> str:
    """:func:`read_signal` as a table."""
    lines = [
        "Dev split, the default reads (as the service answers before any fit).",
        "",
        "| task | type | n | gold per option | answered per option | uncalibrated accuracy | majority | AUROC per option | splits whose drawn gold majority is wrong |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, e in signal.items():
        auroc = ", ".join("—" if a is None else f"{a:.2f}" for a in e["auroc"])
        lines.append(
            f"| {task} | {e['type']} | {e['n']} | {e['gold_counts']} | {e['answered_counts']} | "
            f"{e['uncalibrated_accuracy']:.1%} | {e['majority']:.1%} | {auroc} | "
            f"{e['drawn_majority_wrong']} of {e['splits']} (N = {e['n_gold']}) |"
        )
    return "\n".join(lines) + "\n"


def ece_gaps(confidence: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Per (lo, hi] bin of top probability (as ``calibration.metrics.reliability_bins`` bins), the sum over
    its reads of right (1/0) − top probability: what pools of reads add up to a pooled ECE."""
    bins = np.clip(np.ceil(confidence * n_bins - 1e-9).astype(int) - 1, 0, n_bins - 1)
    return np.bincount(bins, weights=np.asarray(correct, dtype=float) - confidence, minlength=n_bins)


def pooled_ece(pools: Sequence[Mapping]) -> float:
    """The ECE of pools of reads together, each pool its read count ``n`` and :func:`ece_gaps` ``gap``."""
    return float(np.abs(np.sum([p["gap"] for p in pools], axis=0)).sum() / sum(p["n"] for p in pools))


def top_label_ece(confidence: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> float:
    """``calibration.metrics.ece`` from each read's top probability and whether it was right (the
    same (lo, hi] bins), for reads pooled over option counts; one bincount, fast enough to bootstrap."""
    return float(np.abs(ece_gaps(confidence, correct, n_bins)).sum() / len(confidence))


def curve_table(report: dict) -> str:
    """Per type and mode: accuracy / macro-F1 / ECE at each N (means over the type's tasks; and the
    pooled ECE where the curve has it), then per task at N = 50."""
    counts = [str(n) for n in report["counts"]]
    pooled = "pooled_ece" in next(iter(report["types"].values()))["modes"]["temperature"]["50"]
    task_mean = ROUNDS[report.get("round", 1)].get("ece") == "task_ece"
    lines = [
        f"Dev split; {report['splits']} splits per task, N gold answers drawn from one half, the other half scored; "
        f"accuracy / macro-F1 / ECE ({report['n_bins']} bins), means over splits, then over the type's tasks"
        + (
            "; then the ECE of every split's held-out reads pooled (the type's tasks' together)"
            if pooled
            else ""
        )
        + (
            "; then the mean of each task's own pooled ECE (the figure the rule reads)." if task_mean else "."
        ),
        "",
        "| type | mode | " + " | ".join(f"N = {n}" for n in counts) + " |",
        "|---|---|" + "---|" * len(counts),
    ]
    for question_type, entry in report["types"].items():
        for mode, curve in entry["modes"].items():
            cells = [
                f"{curve[n]['accuracy']:.1%} / {curve[n]['macro_f1']:.3f} / {curve[n]['ece']:.3f}"
                + (f" / {curve[n]['pooled_ece']:.3f}" if pooled else "")
                + (f" / **{curve[n]['task_ece']:.3f}**" if task_mean else "")
                for n in counts
            ]
            lines.append(f"| {question_type} | {mode} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| task | type | n | majority (held out) | mode | accuracy (sd) at 50 | macro-F1 at 50 | ECE at 50 |"
        + (" pooled ECE at 50 |" if pooled else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if pooled else ""),
    ]
    for task, entry in report["tasks"].items():
        majority = float(np.mean(entry["majority"]))
        for mode, curve in entry["modes"].items():
            at = curve["50"]
            lines.append(
                f"| {task} | {entry['type']} | {entry['n']} | {majority:.1%} | {mode} | {np.mean(at['accuracy']):.1%} ({np.std(at['accuracy']):.1%}) | "
                f"{np.mean(at['macro_f1']):.3f} | {np.mean(at['ece']):.3f} |"
                + (f" {at['pooled_ece']:.3f} |" if pooled else "")
            )
    lines.append("")
    for question_type, pick in report["chosen"].items():
        start = f" from {pick['from_n']} gold answers" if pick["from_n"] else ""
        lines.append(
            f"chosen for {question_type}: {pick['mode']}{start} (eligible at 50: {', '.join(pick['eligible'])})"
        )
    if report.get("round", 1) >= 5:
        for question_type, pick in report.get("chosen_without_features", {}).items():
            start = f" from {pick['from_n']} gold answers" if pick["from_n"] else ""
            lines.append(f"chosen for {question_type} without the hidden state: {pick['mode']}{start}")
    return "\n".join(lines) + "\n"


SPLIT_TITLES = {"test": "Test samples", "fresh": "Fresh records (read once, for round 5)"}


def confirm_table(report: dict) -> str:
    """Rule step 5's regression table: every task and question type, each figure with its 95% interval."""
    figure = report.get("ece_figure", "ece")
    lines = [
        f"{SPLIT_TITLES[report.get('split', 'test')]}; after {report['n_gold']} gold answers, {report['splits']} splits (half held out), reads pooled over splits; "
        f"95% intervals: cluster bootstrap over records ({report['resamples']:,} resamples, seed {report['seed']}); ECE over {report['n_bins']} bins"
        + ("; a type's ECE the mean of its tasks'." if figure == "task_ece" else "."),
        "",
        "| task | type | n | majority | default | accuracy: temperature → default | Δ accuracy | macro-F1: temperature → default | Δ macro-F1 | ECE: temperature → default | Δ ECE | regresses |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def pair(row: dict, metric: str, percent: bool) -> tuple[str, str]:
        f = (lambda v: f"{v:.1%}") if percent else (lambda v: f"{v:.3f}")
        d = (lambda v: f"{v * 100:+.1f}") if percent else (lambda v: f"{v:+.3f}")
        b, c = row[f"baseline_{metric}_ci95"], row[f"candidate_{metric}_ci95"]
        lo, hi = row[f"difference_{metric}_ci95"]
        return (
            f"{f(row[f'baseline_{metric}'])} ({f(b[0])}–{f(b[1])}) → {f(row[f'candidate_{metric}'])} ({f(c[0])}–{f(c[1])})",
            f"{d(row[f'difference_{metric}'])} ({d(lo)} to {d(hi)})",
        )

    for name, row in report["rows"].items():
        cells = [
            cell
            for metric, pct in (("accuracy", True), ("macro_f1", False), (figure, False))
            for cell in pair(row, metric, pct)
        ]
        label = name if name in TASKS else f"{name} ({', '.join(row['tasks'])})"
        lines.append(
            f"| {label} | {row['type']} | {row['n']} | {row['majority']:.1%} | {row['mode']} | "
            + " | ".join(cells)
            + f" | {'**yes**' if row['regresses'] else 'no'} |"
        )
    lines += ["", "regresses: " + (", ".join(report["regresses"]) or "nothing")]
    return "\n".join(lines) + "\n"


def done_when(dev: dict, test: dict | None = None, fresh: dict | None = None) -> dict:
    """The issue's pass check per question type after 50 gold answers (round 2's rule): accuracy at
    or above the majority rate, above the uncalibrated accuracy where that was below it, ECE no worse
    than temperature's. Dev: the rule's means over splits and tasks, ECE as the round's rule reads it
    (``ROUNDS``' ``ece``); test and fresh: the pooled figures of :func:`confirm` (with
    ``uncalibrated``), ECE as the round's confirmation reads it (``confirm_ece``), each with its
    interval."""
    spec = ROUNDS[dev.get("round", 1)]
    figure, confirmed = spec.get("ece", "ece"), spec.get("confirm_ece", "ece")
    # Each task's own figure for the detail rows: its pooled ECE where the type reads pooled
    # figures, else its splits' mean.
    task_figure = "ece" if figure == "ece" else "pooled_ece"
    out: dict = {"dev": {}, "test": {}} | ({"fresh": {}} if fresh is not None else {})
    for question_type, entry in dev["types"].items():
        mode = dev["chosen"][question_type]["mode"]
        modes = entry["modes"]
        majority = float(np.mean([np.mean(dev["tasks"][t]["majority"]) for t in entry["tasks"]]))
        raw, temp, pick = modes["temperature"]["0"], modes["temperature"]["50"], modes[mode]["50"]
        out["dev"][f"all {question_type}"] = _verdict(
            mode, majority, raw["accuracy"], pick["accuracy"], temp[figure], pick[figure]
        )
        for task in entry["tasks"]:  # each task of the type under the type's default, for the detail
            curves = dev["tasks"][task]["modes"]
            out["dev"][task] = _verdict(
                mode, float(np.mean(dev["tasks"][task]["majority"])),
                *(float(np.mean(curves[m][n]["accuracy"])) for m, n in (("temperature", "0"), (mode, "50"))),
                *(float(np.mean(curves[m]["50"][task_figure])) for m in ("temperature", mode)),
            )  # fmt: skip
    for split_, report in (("test", test), ("fresh", fresh)):
        for name, row in (report or {}).get("rows", {}).items():
            out[split_][name] = _verdict(
                row["mode"], row["majority"], row["uncalibrated_accuracy"], row["candidate_accuracy"],
                row[f"baseline_{confirmed}"], row[f"candidate_{confirmed}"],
            ) | {
                "uncalibrated_accuracy_ci95": row["uncalibrated_accuracy_ci95"],
                "accuracy_ci95": row["candidate_accuracy_ci95"],
                "difference_ece_ci95": row[f"difference_{confirmed}_ci95"],
            }  # fmt: skip
    return out


def _verdict(
    mode: str, majority: float, raw: float, accuracy: float, temperature_ece: float, ece_: float
) -> dict:
    checks = {
        "at_or_above_majority": accuracy >= majority,
        "above_uncalibrated_if_that_was_below_majority": raw >= majority or accuracy > raw,
        "ece_no_worse_than_temperature": ece_ <= temperature_ece,
    }
    return {
        "mode": mode, "majority": majority, "uncalibrated_accuracy": raw, "accuracy": accuracy,
        "temperature_ece": temperature_ece, "ece": ece_, "checks": checks, "passes": all(checks.values()),
    }  # fmt: skip


def done_table(done: dict) -> str:
    """:func:`done_when` as a table: dev rows, then test rows with their 95% intervals."""
    lines = [
        "After 50 gold answers: the issue's pass check (accuracy ≥ majority; > uncalibrated where that was "
        "below majority; ECE ≤ temperature's, on dev as the round's rule reads ECE).",
        "",
        "| split | type / task | default | majority | uncalibrated accuracy | accuracy | ECE: temperature → default | passes | fails on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for split_, rows in done.items():
        for name, v in rows.items():
            fails = [check for check, ok in v["checks"].items() if not ok]
            lines.append(
                f"| {split_} | {name} | {v['mode']} | {v['majority']:.1%} | {v['uncalibrated_accuracy']:.1%}"
                f"{_interval(v, 'uncalibrated_accuracy_ci95')} | {v['accuracy']:.1%}{_interval(v, 'accuracy_ci95')} | "
                f"{v['temperature_ece']:.3f} → {v['ece']:.3f} | {'yes' if v['passes'] else '**no**'} | "
                f"{', '.join(fails) or '—'} |"
            )
    return "\n".join(lines) + "\n"


def _interval(verdict: dict, key: str) -> str:
    return f" ({verdict[key][0]:.1%}–{verdict[key][1]:.1%})" if key in verdict else ""


def run_few_shot(
    out: Path,
    *,
    dev_runs: Mapping[str, Path] | None = None,
    test_run: Path | None = None,
    fresh_run: Path | None = None,
    seed: int = 0,
    round_: int = 1,
) -> dict:
    """The dev curve, the rule's choice and (with ``test_run``, ``fresh_run``) its confirmations,
    written into ``out``: dev-curve.{json,md}, few-shot.png, test-confirm.{json,md},
    fresh-confirm.{json,md} (from round 5, also ``*-confirm-without-features`` where the rule without
    the probe picks anything but temperature: the defaults without the hidden state); from round 2
    also read-signal.{json,md} (:func:`read_signal`, the study written before round 2's rule) and
    done-when.{json,md}."""
    from eval.evidence.figures import plot_few_shot_curves

    spec = ROUNDS[round_]
    members = spec.get("probe_members", PROBE_MEMBERS)
    runs = {k: Path(v) for k, v in (dev_runs or DEV_RUNS).items()}
    confirmations = {
        name: Path(run) for name, run in (("test", test_run), ("fresh", fresh_run)) if run is not None
    }
    dev_features = None
    split_features: dict[str, dict | None] = dict.fromkeys(confirmations)
    if any(mode in FEATURE_MODES for mode in spec["modes"]):
        import asyncio

        from eval.decisions.features import run_features

        dev_features = asyncio.run(run_features(runs, "dev"))
        types = {TASKS[task].question_type for task in TASKS}
        for name, run in confirmations.items():
            split_features[name] = asyncio.run(run_features(dict.fromkeys(types, run), name))
    dev = curve_report(
        runs, seed=seed, modes=spec["modes"], probe_members=members,
        features=None if dev_features is None else {t: f for t, (f, _) in dev_features.items()},
    )  # fmt: skip
    dev["round"] = round_
    if dev_features is not None:
        dev["features_sha256"] = {task: sha for task, (_, sha) in dev_features.items()}
    figure, confirmed = spec.get("ece", "ece"), spec.get("confirm_ece", "ece")
    dev["chosen"] = choose(dev["types"], spec["candidates"], figure)
    plain = [mode for mode in spec["candidates"] if mode not in FEATURE_MODES]
    if round_ >= 5 and len(plain) < len(spec["candidates"]):
        # The defaults where a decision comes without the hidden state: the same rule without the probe.
        dev["chosen_without_features"] = choose(dev["types"], plain, figure)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "dev-curve.json", dev)
    (out / "dev-curve.md").write_text(curve_table(dev))
    plot_few_shot_curves(dev, out / "few-shot.png", figure)
    result = {"dev": dev}
    for name, run in confirmations.items():
        features = split_features[name]
        report = confirm(
            load_rows(run), dev["chosen"], seed=seed, uncalibrated=round_ > 1, probe_members=members,
            features=None if features is None else {t: f for t, (f, _) in features.items()},
            ece_figure=confirmed, split_name=name,
        )  # fmt: skip
        if features is not None:
            report["features_sha256"] = {task: sha for task, (_, sha) in sorted(features.items())}
        write_json(out / f"{name}-confirm.json", report)
        (out / f"{name}-confirm.md").write_text(confirm_table(report))
        result[name] = report
        without = dev.get("chosen_without_features", {})
        if round_ >= 5 and any(pick["mode"] != "temperature" for pick in without.values()):
            # A pick without the probe that moves a default is confirmed as the rule confirms any pick.
            report = confirm(
                load_rows(run), without, seed=seed, uncalibrated=True,
                ece_figure=confirmed, split_name=name,
            )  # fmt: skip
            write_json(out / f"{name}-confirm-without-features.json", report)
            (out / f"{name}-confirm-without-features.md").write_text(confirm_table(report))
            result[f"{name} without features"] = report
    if round_ > 1:
        signal = read_signal({k: Path(v) for k, v in (dev_runs or DEV_RUNS).items()}, seed=seed)
        write_json(out / "read-signal.json", signal)
        (out / "read-signal.md").write_text(signal_table(signal))
        result["done_when"] = done_when(dev, result.get("test"), result.get("fresh"))
        write_json(out / "done-when.json", result["done_when"])
        (out / "done-when.md").write_text(done_table(result["done_when"]))
    return result
