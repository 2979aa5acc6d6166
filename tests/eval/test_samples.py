"""The shipped task samples: counts, stratification, checksums, and a rebuild from ../shared/data."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest

from eval.samples import SAMPLE_SIZE, build_samples
from eval.tasks import TASKS, load_sample

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
MANIFEST = json.loads(resources.files("eval.data").joinpath("MANIFEST.json").read_text())


@pytest.mark.parametrize("task", list(TASKS))
def test_shipped_sample_matches_its_manifest(task):
    payload = resources.files("eval.data").joinpath(f"{task}.jsonl").read_bytes()
    entry = MANIFEST["tasks"][task]
    assert hashlib.sha256(payload).hexdigest() == entry["sample_sha256"]
    records = load_sample(task)
    assert len(records) == SAMPLE_SIZE == entry["records"]
    assert len({record.id for record in records}) == SAMPLE_SIZE
    assert all(
        record.id.startswith(f"{task}-") and record.text == record.text.strip() and record.text
        for record in records
    )
    assert {record.gold for record in records} == set(TASKS[task].options)
    assert entry["licence"] and entry["upstream"] and entry["source_sha256"]


def test_stratification_follows_the_upstream_class_shares():
    # Proportional allocation: SST-2 dev has 444 of 872 positive → 153 of 300; AG News is balanced.
    assert MANIFEST["tasks"]["sst2"]["classes"] == {"negative": 147, "positive": 153}
    assert set(MANIFEST["tasks"]["ag_news"]["classes"].values()) == {75}
    assert MANIFEST["tasks"]["irony"]["classes"] == {"false": 181, "true": 119}


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside this checkout")
def test_samples_rebuild_byte_for_byte_from_shared_data(tmp_path):
    for entry in MANIFEST["tasks"].values():
        for name, digest in entry["source_sha256"].items():
            assert hashlib.sha256((SHARED / name).read_bytes()).hexdigest() == digest, name
    rebuilt = build_samples(SHARED, tmp_path)
    assert rebuilt == MANIFEST
    for task in TASKS:
        shipped = resources.files("eval.data").joinpath(f"{task}.jsonl").read_bytes()
        assert (tmp_path / f"{task}.jsonl").read_bytes() == shipped
