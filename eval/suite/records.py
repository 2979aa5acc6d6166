"""The public suite's records in Nimble's format: write a subset, build one from the shipped tasks,
load and validate a suite directory.

A suite directory holds ``<subset>/all.jsonl`` (one record per line, split on ``\\n`` only: lines
may contain U+2028) and ``<subset>/manifest.json``. Each record is
``{id, split, domain, family, input: {state, questions}, reference: {target, distribution?, …}}`` and
``input`` is a Jev request. Each subset's sha256 is checked against the published ``dataset_sha256``
(``eval/data/reference/suite_checksums.json``) and its manifest's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from calibration.fit import gold_index
from eval.decisions.samples import SOURCES, unsampled_records
from eval.decisions.tasks import TASKS, Record
from eval.evidence.manifest import RunRefused, write_json
from eval.suite.scorecard import MISMATCH, checksum_status, published_checksums
from service.protocol import SystemOneRequest

# Human distributions are written as decimals (civil_comments: toxicity and 1 - toxicity).
DISTRIBUTION_TOLERANCE = 1e-6


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


def _target(question_type: str, gold: str) -> bool | int | str:
    """A task's gold answer as the suite writes its targets: a boolean, a level number or an option name."""
    if question_type == "noul":
        return gold == "true"
    return int(gold) if question_type == "score" else gold


def build_from_tasks(
    out: Path, *, tasks: Sequence[str] = tuple(TASKS), unsampled: Path | None = None
) -> dict[str, str]:
    """A Nimble-format suite from the shipped task samples (one subset per task); returns sha256s.
    With ``unsampled`` (the upstream data directory, ``../shared/data``): subset ``<task>-unsampled``
    holds the task's upstream rows in neither shipped split instead (``eval.decisions.samples.unsampled_records``),
    records to confirm a read chosen on the others."""
    digests = {}
    for name in tasks:
        task = TASKS[name]
        if unsampled is None:
            subset, source, rows = name, "opendecide shipped task sample (eval/data)", task.records()
        else:
            subset = f"{name}-unsampled"
            source = f"upstream rows in neither shipped sample: {SOURCES[task.sample_name]['upstream']}"
            rows = [
                Record(r.id, name, r.text, task.gold_map.get(r.gold, r.gold))
                for r in unsampled_records(unsampled, task.sample_name)
            ]
        records = [
            {
                "id": record.id, "split": "test", "domain": name, "family": record.id, "source_family": name,
                "input": {"state": record.text, "questions": {"answer": task.question()}},
                "reference": {"target": _target(task.question_type, record.gold)},
            }
            for record in rows
        ]  # fmt: skip
        digests[subset] = write_subset(out, subset, records, source=source, types=[task.question_type])
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
    :func:`eval.suite.scorecard.checksum_status`; ``published`` defaults to the shipped table).

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
