"""The public suite in Nimble's record format: build, validate, run, and score into the suite's scorecard.

A suite directory holds ``<subset>/all.jsonl`` (one record per line, split on ``\\n`` only: lines
may contain U+2028) and ``<subset>/manifest.json``. Each record is
``{id, split, domain, family, input: {state, questions}, reference: {target, distribution?, …}}`` and
``input`` is a Jev request. Each subset's sha256 is checked against the published ``dataset_sha256``
(``eval/data/reference/suite_checksums.json``) and its manifest's.

The scorecard, per subset, per question type and overall: pooled accuracy (Wilson 95% interval) and
macro accuracy, families complete, ECE on 10 bins (as the published tables), Brier, ECE after 50 gold
answers (20 splits) and medians over subsets; score subsets' MAE and Spearman; distribution subsets'
Jensen–Shannon divergence and total variation; family-clustered bootstrap intervals
(:mod:`eval.scorecard`); and "Jev minus arm" with an unpaired two-proportion 95% interval against
``eval/data/reference/published_jev_nimble.json`` (Jev 1.13.0 as published by Bespoke Labs).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from calibration.fit import gold_index
from calibration.metrics import SUITE_N_BINS, brier_loss, ece
from calibration.temperature import as_logits
from eval.evidence import RECORDS, RecordWriter, load_rows, rows_arrays
from eval.gold_curve import gold_curve
from eval.manifest import MANIFEST, Images, RunRefused, check_directory, run_manifest, write_json
from eval.score import Z95, wilson_interval
from eval.scorecard import (
    MISMATCH,
    checksum_status,
    families_complete,
    family_bootstrap,
    js_divergence_bits,
    level_mae,
    level_spearman,
    published_checksums,
    total_variation,
)
from eval.tasks import TASKS, load_sample
from readers.engines.base import Engine
from readers.reader import Reader
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION, OptionPriors, PriorCorrection
from service.protocol import SystemOneRequest

# Human distributions are written as decimals (civil_comments: toxicity and 1 - toxicity).
DISTRIBUTION_TOLERANCE = 1e-6
RESAMPLES = 1000


@dataclass(frozen=True)
class SuiteRecord:
    subset: str
    id: str
    family: str
    body: dict[str, Any]
    question: str
    question_type: str
    options: tuple[str, ...]
    gold: str
    distribution: dict[str, float] | None = None  # reference.distribution, in option order


def published_jev() -> dict:
    return json.loads(
        resources.files("eval.data.reference").joinpath("published_jev_nimble.json").read_text()
    )


def write_subset(out: Path, subset: str, records: list[dict], **manifest_fields: Any) -> str:
    """Write ``out/<subset>/all.jsonl`` (one contract record per line) and a ``manifest.json`` giving its
    ``dataset_sha256``, ``count``, ``ids`` and ``manifest_fields``; returns the sha256."""
    payload = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode()
    (out / subset).mkdir(parents=True, exist_ok=True)
    (out / subset / "all.jsonl").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    manifest = {
        **manifest_fields,
        "dataset_sha256": digest,
        "count": len(records),
        "ids": [record["id"] for record in records],
    }
    write_json(out / subset / "manifest.json", manifest)
    return digest


def build_from_tasks(out: Path) -> dict[str, str]:
    """A Nimble-format suite from the shipped task samples (one subset per task); returns sha256s."""
    digests = {}
    for name, task in TASKS.items():
        records = [
            {
                "id": record.id, "split": "test", "domain": name, "family": record.id, "source_family": name,
                "input": {"state": record.text, "questions": {"answer": task.question()}},
                "reference": {"target": record.gold == "true" if task.question_type == "noul" else record.gold},
            }
            for record in load_sample(name)
        ]  # fmt: skip
        digests[name] = write_subset(
            out,
            name,
            records,
            source="opendecide shipped task sample (eval/data)",
            types=[task.question_type],
        )
    return digests


def load_suite(
    data: Path,
    *,
    allow_unverified: bool = False,
    allow_mismatch: bool = False,
    published: dict[str, str] | None = None,
) -> tuple[list[SuiteRecord], dict[str, dict]]:
    """Every record of every subset, validated against the record contract, and each subset's checksum
    check: subset → ``{sha256, manifest_sha256, published_sha256, status}`` (status from
    :func:`eval.scorecard.checksum_status`; ``published`` defaults to the shipped table).

    Refused: a ``mismatch`` unless ``allow_mismatch``; a subset with neither a published checksum nor a
    manifest ``dataset_sha256`` unless ``allow_unverified``; a record that breaks the contract."""
    published = published_checksums() if published is None else published
    records, checks = [], {}
    subsets = sorted(path.parent for path in data.glob("*/all.jsonl"))
    if not subsets:
        raise RunRefused(f"{data} holds no <subset>/all.jsonl")
    for folder in subsets:
        subset = folder.name
        payload = (folder / "all.jsonl").read_bytes()
        digest = hashlib.sha256(payload).hexdigest()
        manifest_path = folder / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        except json.JSONDecodeError as error:
            raise RunRefused(f"{subset}/manifest.json: not JSON ({error.msg})") from None
        expected = manifest.get("dataset_sha256")
        status = checksum_status(digest, published=published.get(subset), manifest=expected)
        if status == MISMATCH and not allow_mismatch:
            against = " and ".join(
                f"{name} says {value}"
                for name, value in (
                    ("the published table", published.get(subset)),
                    ("its manifest", expected),
                )
                if value not in (None, digest)
            )
            raise RunRefused(
                f"{subset}/all.jsonl has sha256 {digest}, {against}; pass --allow-mismatch to run it anyway"
            )
        if expected is None and subset not in published and not allow_unverified:
            raise RunRefused(
                f"{subset} has no manifest.json with dataset_sha256; pass --allow-unverified to run it anyway"
            )
        checks[subset] = {
            "sha256": digest,
            "manifest_sha256": expected,
            "published_sha256": published.get(subset),
            "status": status,
        }
        mine = [
            _record(subset, number, line)
            for number, line in enumerate(payload.decode("utf-8").split("\n"), 1)
            if line.strip()
        ]
        seen: set[str] = set()
        for record in mine:
            if record.id in seen:
                raise RunRefused(f"{subset}/all.jsonl: id {record.id!r} appears twice")
            seen.add(record.id)
        if "count" in manifest and manifest["count"] != len(mine):
            raise RunRefused(
                f"{subset}: manifest.json count is {manifest['count']}, all.jsonl holds {len(mine)} records"
            )
        records += mine
    return records, checks


def _record(subset: str, number: int, line: str) -> SuiteRecord:
    """One line of ``<subset>/all.jsonl`` checked against the record contract (RunRefused names the field)."""
    where = f"{subset}/all.jsonl line {number}"
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as error:
        raise RunRefused(f"{where}: not JSON ({error.msg})") from None
    if not isinstance(raw, dict):
        raise RunRefused(f"{where}: a record is a JSON object")
    for field in ("id", "family", "input", "reference"):
        if field not in raw:
            raise RunRefused(f"{where}: no {field!r}")
    where = f"{where} (id {raw['id']!r})"
    try:
        request = SystemOneRequest.model_validate(raw["input"])
    except ValidationError as error:
        raise RunRefused(
            f"{where}: input is not a Jev request: {error.errors()[0]['msg']} at {error.errors()[0]['loc']}"
        ) from None
    (name, question), *rest = request.questions.items()
    if rest:
        raise RunRefused(f"{where}: one question per record expected, input.questions has {len(rest) + 1}")
    spec = question.to_spec()
    reference = raw["reference"]
    if not isinstance(reference, dict) or "target" not in reference:
        raise RunRefused(f"{where}: no reference.target")
    try:
        gold = spec.options[gold_index(spec.question_type, spec.options, reference["target"])]
    except ValueError as error:
        raise RunRefused(f"{where}: reference.target: {error}") from None
    distribution = _distribution(where, spec.options, reference.get("distribution"))
    return SuiteRecord(
        subset,
        str(raw["id"]),
        str(raw["family"]),
        raw["input"],
        name,
        spec.question_type,
        spec.options,
        gold,
        distribution,
    )


def _distribution(where: str, options: tuple[str, ...], distribution: Any) -> dict[str, float] | None:
    """``reference.distribution``: a probability over exactly the question's option keys (sums to 1)."""
    if distribution is None:
        return None
    if not isinstance(distribution, dict) or set(distribution) != set(options):
        got = sorted(distribution) if isinstance(distribution, dict) else type(distribution).__name__
        raise RunRefused(f"{where}: reference.distribution must give each of {list(options)}, got {got}")
    values = list(distribution.values())
    if (
        not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values)
        or abs(sum(values) - 1) > DISTRIBUTION_TOLERANCE
    ):
        raise RunRefused(
            f"{where}: reference.distribution must be non-negative numbers summing to 1, got {distribution}"
        )
    return {option: float(distribution[option]) for option in options}


async def run_suite(
    engine: Engine,
    data: Path,
    out: Path,
    *,
    concurrency: int = 4,
    allow_unverified: bool = False,
    allow_mismatch: bool = False,
    images: Images | None = None,
    prior_correction: PriorCorrection = DEFAULT_PRIOR_CORRECTION,
) -> dict:
    """Read (or resume) every suite record at ``data`` into ``out``, answered as ``decide serve``
    answers with ``prior_correction``; returns the final manifest (with each subset's checksum check
    under ``checksums``)."""
    records, checks = load_suite(data, allow_unverified=allow_unverified, allow_mismatch=allow_mismatch)
    prior_correction = PriorCorrection(prior_correction)
    out.mkdir(parents=True, exist_ok=True)
    args = {"data": str(data), "concurrency": concurrency, "prior_correction": prior_correction.value}
    manifest = run_manifest("suite", engines={"run": engine}, args=args, images=images, status="started")
    manifest["data_sha256"] = {subset: check["sha256"] for subset, check in checks.items()}
    manifest["checksums"] = checks
    check_directory(out, manifest)
    write_json(out / MANIFEST, manifest)
    fields = ("id", "subset", "question_type", "family", "gold")

    def base(r: SuiteRecord) -> dict:
        row = {
            **{name: getattr(r, name) for name in fields},
            "task": r.subset,
            "variant": "original",
            "options": list(r.options),
        }
        return row | ({"distribution": r.distribution} if r.distribution is not None else {})

    async with RecordWriter(out / RECORDS) as sink:
        priors = None if prior_correction is PriorCorrection.OFF else OptionPriors(prior_correction)
        await sink.read_all(
            Reader(engine),
            [(base(r), r.body, r.question) for r in records],
            concurrency=concurrency,
            priors=priors,
        )
    manifest["status"] = "success"
    manifest["records"] = len(records)
    write_json(out / MANIFEST, manifest)
    return manifest


async def score_suite_with_engine(
    engine_spec: str,
    data: Path,
    out: Path,
    *,
    engine_url: str | None = None,
    top_k: int | None = None,
    resamples: int = RESAMPLES,
    **options,
) -> dict:
    """Open the engine ``engine_spec`` names, :func:`run_suite` through it, then score the run into
    ``out`` (suite.json, suite.md, ``resamples`` family-bootstrap resamples); returns the report."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(engine_spec, top_k=top_k, engine_url=engine_url) as engine:
        await run_suite(engine, data, out, **options)
    report = score_suite(out, resamples=resamples)
    write_json(out / "suite.json", report)
    (out / "suite.md").write_text(suite_table(report))
    return report


def jev_minus_arm(
    jev_accuracy: float, jev_n: int, arm_accuracy: float, arm_n: int
) -> tuple[float, float, float]:
    """Difference of two independent proportions with its normal 95% interval (unpaired)."""
    se = math.sqrt(jev_accuracy * (1 - jev_accuracy) / jev_n + arm_accuracy * (1 - arm_accuracy) / arm_n)
    difference = jev_accuracy - arm_accuracy
    return difference, difference - Z95 * se, difference + Z95 * se


def _group_scores(rows: list[dict], jev: tuple[float, int] | None) -> dict:
    correct = sum(row["predicted"] == row["gold"] for row in rows)
    lo, hi = wilson_interval(correct, len(rows))
    result = {"n": len(rows), "accuracy": correct / len(rows), "accuracy_ci95": [lo, hi]}
    if jev is not None:
        difference, d_lo, d_hi = jev_minus_arm(jev[0], jev[1], result["accuracy"], len(rows))
        result |= {"jev_accuracy": jev[0], "jev_minus_arm": difference, "jev_minus_arm_ci95": [d_lo, d_hi]}
    return result


def score_suite(run: Path, *, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """The scorecard of a suite run: per subset, per question type and overall; see the module docstring
    and :mod:`eval.scorecard` for each figure's definition."""
    every = load_rows(run / RECORDS)
    rows = [row for row in every if row["status"] == "ok"]
    if not rows:
        raise RunRefused(f"{run}: no successful reads to score")
    errors = sum(1 for row in every if row["status"] != "ok")
    published = published_jev()["subsets"]
    manifest_path = run / MANIFEST
    checksums = json.loads(manifest_path.read_text()).get("checksums", {}) if manifest_path.is_file() else {}
    subsets, per_subset = {}, {}
    for subset in sorted({row["subset"] for row in rows}):
        mine = [row for row in rows if row["subset"] == subset]
        p, y = rows_arrays(mine)
        per_subset[subset] = (mine, p, y)
        jev = published.get(subset)
        entry = _group_scores(mine, (jev["jev_acc"], jev["n"]) if jev else None)
        complete, families = families_complete(
            [row["predicted"] == row["gold"] for row in mine], [row["family"] for row in mine]
        )
        entry |= {
            "question_type": mine[0]["question_type"],
            "families": families,
            "families_complete": complete,
        }
        entry |= {"ece": ece(p, y, SUITE_N_BINS), "brier": brier_loss(p, y)}
        if len(mine) >= 100:
            points = gold_curve(as_logits(p), y, counts=(50,), splits=20, seed=seed, n_bins=SUITE_N_BINS)[
                "points"
            ]
            entry["ece_after_50"] = points[0]["ece_mean"]
        if jev:
            entry |= {"jev_ece": jev["jev_ece"], "jev_brier": jev["jev_brier"]}
        if subset in checksums:
            entry["checksum"] = checksums[subset]["status"]
        subsets[subset] = entry

    statistic = _scorecard_statistic(per_subset)
    n = sum(len(mine) for mine, _, _ in per_subset.values())
    point = statistic(np.arange(n))
    strata = [subset for subset, (mine, _, _) in per_subset.items() for _ in mine]
    families = [row["family"] for mine, _, _ in per_subset.values() for row in mine]
    intervals = family_bootstrap(strata, families, statistic, resamples=resamples, seed=seed)
    for (group, name, metric), value in point.items():
        if group == "subset" and metric not in subsets[name]:
            subsets[name][metric] = value
    for (group, name, metric), interval in intervals.items():
        if group == "subset":
            subsets[name][f"{metric}_family_ci95"] = None if interval is None else list(interval)

    def pooled(question_type: str | None) -> dict | None:
        chosen = [row for row in rows if question_type is None or row["question_type"] == question_type]
        if not chosen:
            return None
        names = sorted({row["subset"] for row in chosen})
        jev = None
        if set(names) <= set(published):
            count = sum(published[s]["n"] for s in names)
            jev = (sum(published[s]["jev_acc"] * published[s]["n"] for s in names) / count, count)
        entry = _group_scores(chosen, jev) | {"subsets": len(names)}
        key = question_type or "all"
        entry["macro_accuracy"] = point[("group", key, "macro_accuracy")]
        if jev is not None:
            entry["jev_macro_accuracy"] = statistics.fmean(published[s]["jev_acc"] for s in names)
        for metric in ("accuracy", "macro_accuracy"):
            interval = intervals[("group", key, metric)]
            entry[f"{metric}_family_ci95"] = None if interval is None else list(interval)
        return entry

    question_types = {name: entry for name in ("noul", "choice", "score") if (entry := pooled(name))}
    after = [s["ece_after_50"] for s in subsets.values() if "ece_after_50" in s]
    return {
        "run": str(run),
        "n_bins": SUITE_N_BINS,
        "errors": errors,
        "bootstrap": {
            "resamples": resamples,
            "seed": seed,
            "cluster": "family, resampled within each subset",
            "interval": "percentile 2.5-97.5",
        },
        "checksums": checksums,
        "subsets": subsets,
        "question_types": question_types,
        "overall": pooled(None),
        "median_ece": statistics.median(s["ece"] for s in subsets.values()),
        "median_ece_after_50": statistics.median(after) if after else None,
        "median_brier": statistics.median(s["brier"] for s in subsets.values()),
    }


FigureKey = tuple[str, str, str]


def _scorecard_statistic(per_subset: dict[str, tuple[list[dict], np.ndarray, np.ndarray]]):
    """The function :func:`eval.scorecard.family_bootstrap` resamples: record indices (into the
    subsets' rows, concatenated in order) → every bootstrapped figure, keyed (``subset``, name, metric)
    or (``group``, question type or ``all``, ``accuracy``/``macro_accuracy``)."""
    names = list(per_subset)
    offsets = np.cumsum([0] + [len(mine) for mine, _, _ in per_subset.values()])
    code = np.concatenate([np.full(len(mine), i) for i, (mine, _, _) in enumerate(per_subset.values())])
    correct = np.concatenate([p.argmax(axis=1) == y for _, p, y in per_subset.values()]).astype(float)
    types = {name: mine[0]["question_type"] for name, (mine, _, _) in per_subset.items()}
    # Brier is a mean of per-record terms, so resamples average these instead of calling scikit-learn.
    brier = [((p - np.eye(p.shape[1])[y]) ** 2).sum(axis=1) for _, p, y in per_subset.values()]
    # Per-record distances to the human distribution (NaN where a record has none).
    distances = {}
    for i, (mine, p, _) in enumerate(per_subset.values()):
        has = np.array(["distribution" in row for row in mine])
        if has.any():
            human = np.array(
                [[row["distribution"][o] for o in row["options"]] for row, h in zip(mine, has) if h]
            )
            js, tv = np.full(len(mine), np.nan), np.full(len(mine), np.nan)
            js[has], tv[has] = js_divergence_bits(p[has], human), total_variation(p[has], human)
            distances[i] = (js, tv)

    def statistic(indices: np.ndarray) -> dict[FigureKey, float | None]:
        drawn = code[indices]
        counts = np.bincount(drawn, minlength=len(names))
        hits = np.bincount(drawn, correct[indices], minlength=len(names))
        values: dict[FigureKey, float | None] = {}
        for i, name in enumerate(names):
            values[("subset", name, "accuracy")] = hits[i] / counts[i]
            local = indices[drawn == i] - offsets[i]
            _, p, y = per_subset[name]
            values[("subset", name, "ece")] = ece(p[local], y[local], SUITE_N_BINS)
            values[("subset", name, "brier")] = float(np.mean(brier[i][local]))
            if types[name] == "score":
                values[("subset", name, "mae")] = level_mae(p[local], y[local])
                values[("subset", name, "spearman")] = level_spearman(p[local], y[local])
            if i in distances:
                for metric, per_record in zip(("js_divergence_bits", "total_variation"), distances[i]):
                    chosen = per_record[local]
                    values[("subset", name, metric)] = (
                        float(np.nanmean(chosen)) if not np.isnan(chosen).all() else None
                    )
        for group in ("all", "noul", "choice", "score"):
            members = [i for i, name in enumerate(names) if group in ("all", types[name])]
            if members:
                values[("group", group, "accuracy")] = hits[members].sum() / counts[members].sum()
                values[("group", group, "macro_accuracy")] = float(np.mean(hits[members] / counts[members]))
        return values

    return statistic


def _ci(interval: list[float] | None, *, percent: bool = False) -> str:
    """A 95% range as text: percentages to 0.1 points, other figures to 3 decimals ("to" when signed)."""
    if interval is None:
        return "—"
    lo, hi = interval
    if percent:
        return f"{lo:.1%}–{hi:.1%}"
    return f"{lo:.3f} to {hi:.3f}" if lo < 0 else f"{lo:.3f}–{hi:.3f}"


def _value(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def suite_table(report: dict) -> str:
    """The scorecard as markdown: groups, subsets, score subsets, distribution subsets, checksums."""

    def jev_cells(entry: dict) -> str:
        if "jev_accuracy" not in entry:
            return "— | — | —"
        lo, hi = entry["jev_minus_arm_ci95"]
        return f"{entry['jev_accuracy']:.1%} | {entry['jev_macro_accuracy']:.1%} | {entry['jev_minus_arm'] * 100:+.1f} ({lo * 100:+.1f} to {hi * 100:+.1f})"

    boot = report["bootstrap"]
    lines = [
        (
            f"Pooled accuracy is over records (Wilson 95% range, and the family-clustered bootstrap range); macro is the mean of subset "
            f"accuracies. Bootstrap: {boot['resamples']} resamples of families within each subset, seed {boot['seed']}. "
            f"Jev minus arm is pooled and unpaired (two-proportion normal interval); ECE over {report['n_bins']} bins."
        ),
        "",
        "| questions | subsets | records | pooled accuracy (Wilson 95%) | family 95% | macro accuracy (family 95%) | Jev pooled | Jev macro | Jev minus arm, points (95% range) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in [("all", report["overall"]), *report["question_types"].items()]:
        lo, hi = entry["accuracy_ci95"]
        lines.append(
            f"| {name} | {entry['subsets']} | {entry['n']} | {entry['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | {_ci(entry['accuracy_family_ci95'], percent=True)} | "
            f"{entry['macro_accuracy']:.1%} ({_ci(entry['macro_accuracy_family_ci95'], percent=True)}) | {jev_cells(entry)} |"
        )  # fmt: skip
    lines += [
        "", "| subset | question type | n | families (complete) | accuracy (Wilson 95%) | family 95% | ECE | ECE after 50 gold answers | Brier | Jev accuracy / ECE / Brier | checksum |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, s in report["subsets"].items():
        lo, hi = s["accuracy_ci95"]
        jev = (
            f"{s['jev_accuracy']:.1%} / {s['jev_ece']:.3f} / {s['jev_brier']:.3f}"
            if "jev_accuracy" in s
            else "—"
        )
        lines.append(
            f"| {name} | {s['question_type']} | {s['n']} | {s['families']} ({s['families_complete']}) | {s['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | "
            f"{_ci(s['accuracy_family_ci95'], percent=True)} | {s['ece']:.3f} | {_value(s.get('ece_after_50'))} | {s['brier']:.3f} | {jev} | {s.get('checksum', '—')} |"
        )  # fmt: skip
    scored = {name: s for name, s in report["subsets"].items() if "mae" in s}
    if scored:
        lines += ["", "Score subsets: expected level (Σ k·p_k) against the gold level.", "",
                  "| subset | n | MAE, levels (family 95%) | Spearman (family 95%) |", "|---|---|---|---|"]  # fmt: skip
        for name, s in scored.items():
            lines.append(
                f"| {name} | {s['n']} | {s['mae']:.3f} ({_ci(s['mae_family_ci95'])}) | {_value(s['spearman'])} ({_ci(s['spearman_family_ci95'])}) |"
            )
    spread = {name: s for name, s in report["subsets"].items() if "js_divergence_bits" in s}
    if spread:
        lines += ["", "Distribution subsets: the model's probabilities against the human label distribution, mean over records.", "",
                  "| subset | n | Jensen–Shannon divergence, bits (family 95%) | total variation (family 95%) |", "|---|---|---|---|"]  # fmt: skip
        for name, s in spread.items():
            lines.append(
                f"| {name} | {s['n']} | {_value(s['js_divergence_bits'])} ({_ci(s['js_divergence_bits_family_ci95'])}) | "
                f"{_value(s['total_variation'])} ({_ci(s['total_variation_family_ci95'])}) |"
            )  # fmt: skip
    after = report["median_ece_after_50"]
    lines.append(
        f"\nMedian over subsets: ECE {report['median_ece']:.3f}, after 50 gold answers {'—' if after is None else f'{after:.3f}'}, "
        f"Brier {report['median_brier']:.3f} (Jev 1.13.0 published: ECE 0.071, Brier 0.267). Unreadable records: {report['errors']}."
    )  # fmt: skip
    if report["checksums"]:
        counts = {
            status: sum(c["status"] == status for c in report["checksums"].values())
            for status in ("verified", "mismatch", "unknown")
        }
        lines.append(
            f"Checksums against the published dataset_sha256: {counts['verified']} verified, {counts['mismatch']} mismatch, {counts['unknown']} unknown (none published)."
        )
    return "\n".join(lines) + "\n"
