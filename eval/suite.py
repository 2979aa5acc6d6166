"""The public suite in Nimble's record format: build, run, score against Jev's published figures.

A suite directory holds ``<subset>/all.jsonl`` (one record per line, split on ``\\n`` only: lines
may contain U+2028) and ``<subset>/manifest.json``. Each record is
``{id, split, domain, family, input: {state, questions}, reference: {target, …}}`` and ``input`` is a
Jev request. When a manifest gives ``dataset_sha256``, the subset's bytes must match it.

Scores per subset, per question type and overall (pooled over records): accuracy with a Wilson 95%
interval, ECE on 10 bins (as the published tables), Brier, ECE after 50 gold answers (20 splits) and its
median over subsets, and "Jev minus arm" with an unpaired two-proportion 95% interval against
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

from calibration.fit import gold_index
from calibration.metrics import SUITE_N_BINS, brier_loss, ece
from calibration.temperature import as_logits
from eval.evidence import RECORDS, RecordWriter, load_rows, rows_arrays
from eval.gold_curve import gold_curve
from eval.manifest import MANIFEST, Images, RunRefused, check_directory, run_manifest, write_json
from eval.score import Z95, wilson_interval
from eval.tasks import TASKS, load_sample
from readers.engines.base import Engine
from readers.reader import Reader
from service.protocol import SystemOneRequest


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


def published_jev() -> dict:
    return json.loads(resources.files("eval.data.reference").joinpath("published_jev_nimble.json").read_text())


def build_from_tasks(out: Path) -> dict[str, str]:
    """A Nimble-format suite from the shipped task samples (one subset per task); returns sha256s."""
    digests = {}
    for name, task in TASKS.items():
        records = load_sample(name)
        lines = [
            json.dumps(
                {
                    "id": record.id, "split": "test", "domain": name, "family": record.id, "source_family": name,
                    "input": {"state": record.text, "questions": {"answer": task.question()}},
                    "reference": {"target": record.gold == "true" if task.question_type == "noul" else record.gold},
                },
                ensure_ascii=False,
            )  # fmt: skip
            for record in records
        ]
        payload = ("\n".join(lines) + "\n").encode()
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "all.jsonl").write_bytes(payload)
        digests[name] = hashlib.sha256(payload).hexdigest()
        manifest = {
            "source": "opendecide shipped task sample (eval/data)", "dataset_sha256": digests[name],
            "count": len(records), "types": [task.question_type], "ids": [record.id for record in records],
        }  # fmt: skip
        write_json(out / name / "manifest.json", manifest)
    return digests


def load_suite(data: Path, *, allow_unverified: bool = False) -> tuple[list[SuiteRecord], dict[str, str]]:
    """Every record of every subset, after checking each subset's sha256 against its manifest
    (a subset without ``dataset_sha256`` is refused unless ``allow_unverified``)."""
    records, digests = [], {}
    subsets = sorted(path.parent for path in data.glob("*/all.jsonl"))
    if not subsets:
        raise RunRefused(f"{data} holds no <subset>/all.jsonl")
    for folder in subsets:
        payload = (folder / "all.jsonl").read_bytes()
        digest = hashlib.sha256(payload).hexdigest()
        manifest_path = folder / "manifest.json"
        expected = json.loads(manifest_path.read_text()).get("dataset_sha256") if manifest_path.is_file() else None
        if expected is None and not allow_unverified:
            raise RunRefused(f"{folder.name} has no manifest.json with dataset_sha256; pass --allow-unverified to run it anyway")
        if expected is not None and expected != digest:
            raise RunRefused(f"{folder.name}/all.jsonl has sha256 {digest}, its manifest says {expected}")
        digests[folder.name] = digest
        for line in payload.decode("utf-8").split("\n"):
            if line.strip():
                records.append(_record(folder.name, json.loads(line)))
    return records, digests


def _record(subset: str, raw: dict) -> SuiteRecord:
    body = raw["input"]
    request = SystemOneRequest.model_validate(body)
    (name, question), *rest = request.questions.items()
    if rest:
        raise RunRefused(f"{subset}/{raw['id']}: one question per record expected")
    spec = question.to_spec()
    target = raw["reference"]["target"]
    gold = spec.options[gold_index(spec.question_type, spec.options, target)]
    return SuiteRecord(subset, raw["id"], str(raw.get("family", raw["id"])), body, name, spec.question_type, spec.options, gold)


async def run_suite(
    engine: Engine, data: Path, out: Path, *, concurrency: int = 4, allow_unverified: bool = False, images: Images | None = None
) -> dict:
    """Read (or resume) every suite record at ``data`` into ``out``; returns the final manifest."""
    records, digests = load_suite(data, allow_unverified=allow_unverified)
    out.mkdir(parents=True, exist_ok=True)
    manifest = run_manifest("suite", engines={"run": engine}, args={"data": str(data), "concurrency": concurrency}, images=images, status="started")
    manifest["data_sha256"] = digests
    check_directory(out, manifest)
    write_json(out / MANIFEST, manifest)
    fields = ("id", "subset", "question_type", "family", "gold")
    jobs = [
        ({**{name: getattr(r, name) for name in fields}, "task": r.subset, "variant": "original", "options": list(r.options)}, r.body, r.question)
        for r in records
    ]
    async with RecordWriter(out / RECORDS) as sink:
        await sink.read_all(Reader(engine), jobs, concurrency=concurrency)
    manifest["status"] = "success"
    manifest["records"] = len(records)
    write_json(out / MANIFEST, manifest)
    return manifest


async def score_suite_with_engine(
    engine_spec: str, data: Path, out: Path, *, engine_url: str | None = None, top_k: int | None = None, **options
) -> dict:
    """Open the engine ``engine_spec`` names, :func:`run_suite` through it, then score the run into
    ``out`` (suite.json, suite.md); returns the report."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(engine_spec, top_k=top_k, engine_url=engine_url) as engine:
        await run_suite(engine, data, out, **options)
    report = score_suite(out)
    write_json(out / "suite.json", report)
    (out / "suite.md").write_text(suite_table(report))
    return report


def jev_minus_arm(jev_accuracy: float, jev_n: int, arm_accuracy: float, arm_n: int) -> tuple[float, float, float]:
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


def score_suite(run: Path, *, seed: int = 0) -> dict:
    every = load_rows(run / RECORDS)
    rows = [row for row in every if row["status"] == "ok"]
    errors = sum(1 for row in every if row["status"] != "ok")
    published = published_jev()["subsets"]
    subsets = {}
    for subset in sorted({row["subset"] for row in rows}):
        mine = [row for row in rows if row["subset"] == subset]
        p, y = rows_arrays(mine)
        jev = published.get(subset)
        entry = _group_scores(mine, (jev["jev_acc"], jev["n"]) if jev else None)
        entry |= {"question_type": mine[0]["question_type"], "ece": ece(p, y, SUITE_N_BINS), "brier": brier_loss(p, y)}
        if len(mine) >= 100:
            points = gold_curve(as_logits(p), y, counts=(50,), splits=20, seed=seed, n_bins=SUITE_N_BINS)["points"]
            entry["ece_after_50"] = points[0]["ece_mean"]
        if jev:
            entry |= {"jev_ece": jev["jev_ece"], "jev_brier": jev["jev_brier"]}
        subsets[subset] = entry

    def pooled(question_type: str | None) -> dict | None:
        chosen = [row for row in rows if question_type is None or row["question_type"] == question_type]
        if not chosen:
            return None
        names = {row["subset"] for row in chosen}
        jev = None
        if names <= set(published):
            n = sum(published[s]["n"] for s in names)
            jev = (sum(published[s]["jev_acc"] * published[s]["n"] for s in names) / n, n)
        return _group_scores(chosen, jev)

    question_types = {name: pooled(name) for name in ("noul", "choice", "score") if pooled(name)}
    after = [s["ece_after_50"] for s in subsets.values() if "ece_after_50" in s]
    return {
        "run": str(run),
        "n_bins": SUITE_N_BINS,
        "errors": errors,
        "subsets": subsets,
        "question_types": question_types,
        "overall": pooled(None),
        "median_ece": statistics.median(s["ece"] for s in subsets.values()),
        "median_ece_after_50": statistics.median(after) if after else None,
        "median_brier": statistics.median(s["brier"] for s in subsets.values()),
    }


def suite_table(report: dict) -> str:
    def jev_cells(entry: dict) -> str:
        if "jev_accuracy" not in entry:
            return "— | —"
        lo, hi = entry["jev_minus_arm_ci95"]
        return f"{entry['jev_accuracy']:.1%} | {entry['jev_minus_arm'] * 100:+.1f} ({lo * 100:+.1f} to {hi * 100:+.1f})"

    lines = [
        f"Accuracy with Wilson 95% ranges; Jev minus arm is unpaired (two-proportion normal interval); ECE over {report['n_bins']} bins.",
        "",
        "| questions | records | accuracy (95% range) | Jev (published) | Jev minus arm, points (95% range) |",
        "|---|---|---|---|---|",
    ]
    for name, entry in [("all", report["overall"]), *report["question_types"].items()]:
        lo, hi = entry["accuracy_ci95"]
        lines.append(f"| {name} | {entry['n']} | {entry['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | {jev_cells(entry)} |")
    lines += ["", "| subset | question type | n | accuracy (95% range) | ECE | ECE after 50 gold answers | Brier | Jev accuracy / ECE / Brier |", "|---|---|---|---|---|---|---|---|"]
    for name, s in report["subsets"].items():
        lo, hi = s["accuracy_ci95"]
        jev = f"{s['jev_accuracy']:.1%} / {s['jev_ece']:.3f} / {s['jev_brier']:.3f}" if "jev_accuracy" in s else "—"
        after = f"{s['ece_after_50']:.3f}" if "ece_after_50" in s else "—"
        lines.append(f"| {name} | {s['question_type']} | {s['n']} | {s['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | {s['ece']:.3f} | {after} | {s['brier']:.3f} | {jev} |")
    after = report["median_ece_after_50"]
    lines.append(f"\nMedian over subsets: ECE {report['median_ece']:.3f}, after 50 gold answers {'—' if after is None else f'{after:.3f}'}, Brier {report['median_brier']:.3f} (Jev 1.13.0 published: ECE 0.071, Brier 0.267). Unreadable records: {report['errors']}.")
    return "\n".join(lines) + "\n"
