"""The shipped task samples: counts, stratification, checksums, and a rebuild from ../shared/data."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest

from eval.decisions.samples import (
    DEV_SIZE,
    FRESH_SIZE,
    SAMPLE_SIZE,
    build_samples,
    dev_rows,
    fresh_records,
    stratified_rows,
    unsampled_records,
)
from eval.decisions.tasks import TASKS, load_sample, sample_file
from tests.eval.support import fake_irony

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
MANIFEST = json.loads(resources.files("eval.data").joinpath("MANIFEST.json").read_text())


@pytest.mark.parametrize("sample", list(MANIFEST["tasks"]))
def test_shipped_samples_match_their_manifest(sample):
    entry = MANIFEST["tasks"][sample]
    # Irony's upstream holds 284 rows besides test and dev: its fresh split is all of them.
    fresh_size = 284 if sample == "irony" else FRESH_SIZE
    for split, size, count, digest in [
        ("test", SAMPLE_SIZE, "records", "sample_sha256"),
        ("dev", DEV_SIZE, "dev_records", "dev_sha256"),
        ("fresh", fresh_size, "fresh_records", "fresh_sha256"),
    ]:
        payload = resources.files("eval.data").joinpath(sample_file(sample, split)).read_bytes()
        assert hashlib.sha256(payload).hexdigest() == entry[digest]
        records = load_sample(sample, split)
        assert len(records) == size == entry[count]
        assert len({record.id for record in records}) == size
        assert all(
            record.id.startswith(f"{sample}-") and record.text == record.text.strip() and record.text
            for record in records
        )
    assert entry["licence"] and entry["upstream"] and entry["source_sha256"]


@pytest.mark.parametrize("a, b", [("test", "dev"), ("test", "fresh"), ("dev", "fresh")])
def test_no_two_splits_share_a_record(a, b):
    for sample in MANIFEST["tasks"]:
        one, other = load_sample(sample, a), load_sample(sample, b)
        assert not {r.id for r in one} & {r.id for r in other}
        # SST-5's dev split is upstream's own: its ids differ from the test file's by prefix.
        assert not {r.text for r in one} & {r.text for r in other}, sample


@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_asks_its_records_gold_answers_as_options(task):
    for split in ("test", "dev", "fresh"):
        records = TASKS[task].records(split)
        assert {record.gold for record in records} == set(TASKS[task].options)
        assert all(record.task == task for record in records)


def test_the_three_level_task_merges_the_five_levels():
    five = {r.id: r.gold for r in TASKS["sst5"].records()}
    three = {r.id: r.gold for r in TASKS["sst3"].records()}
    assert five.keys() == three.keys()
    merged = {"0": "0", "1": "0", "2": "1", "3": "2", "4": "2"}
    assert all(three[i] == merged[five[i]] for i in five)
    assert TASKS["sst5"].question()["criteria"][0] == "very negative"
    assert TASKS["sst3"].question() == {
        "type": "score",
        "instructions": TASKS["sst5"].instructions,
        "criteria": ["negative", "neutral", "positive"],
    }


def test_stratification_follows_the_upstream_class_shares():
    # Proportional allocation: SST-2 dev has 444 of 872 positive → 153 of 300; AG News is balanced.
    assert MANIFEST["tasks"]["sst2"]["classes"] == {"negative": 147, "positive": 153}
    assert set(MANIFEST["tasks"]["ag_news"]["classes"].values()) == {75}
    assert MANIFEST["tasks"]["irony"]["classes"] == {"false": 181, "true": 119}
    # SST-5 test: 279 / 633 / 389 / 510 / 399 of 2,210 per level → 38 / 86 / 53 / 69 / 54 of 300.
    assert MANIFEST["tasks"]["sst5"]["classes"] == {"0": 38, "1": 86, "2": 53, "3": 69, "4": 54}


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside this checkout")
def test_samples_rebuild_byte_for_byte_from_shared_data(tmp_path):
    for entry in MANIFEST["tasks"].values():
        for name, digest in entry["source_sha256"].items():
            assert hashlib.sha256((SHARED / name).read_bytes()).hexdigest() == digest, name
    rebuilt = build_samples(SHARED, tmp_path)
    assert rebuilt == MANIFEST
    for sample in MANIFEST["tasks"]:
        for split in ("test", "dev", "fresh"):
            name = sample_file(sample, split)
            assert (tmp_path / name).read_bytes() == resources.files("eval.data").joinpath(name).read_bytes()


def test_the_fresh_split_is_a_stratified_draw_of_the_unsampled_rows(tmp_path):
    fake_irony(tmp_path / "few")
    assert fresh_records(tmp_path / "few", "irony") == unsampled_records(
        tmp_path / "few", "irony"
    )  # 120: all
    fake_irony(tmp_path / "many", rows=1500)
    rest = unsampled_records(tmp_path / "many", "irony")
    fresh = fresh_records(tmp_path / "many", "irony")
    assert len(rest) == 1000 and len(fresh) == FRESH_SIZE
    assert {r.id for r in fresh} <= {r.id for r in rest} and fresh == sorted(fresh, key=rest.index)
    assert sum(r.gold == "true" for r in fresh) == FRESH_SIZE * 2 // 5  # the rows' share, two in five


def test_unsampled_records_are_the_upstream_rows_neither_split_holds(tmp_path):
    fake_irony(tmp_path)
    rest = unsampled_records(tmp_path, "irony")
    labels = [("false", "true")[row % 5 < 2] for row in range(620)]
    test = set(stratified_rows(labels, SAMPLE_SIZE, 20260924))
    dev = set(dev_rows(tmp_path, "irony")[2])
    rows = [int(record.id.removeprefix("irony-")) for record in rest]
    assert len(rest) == 620 - SAMPLE_SIZE - DEV_SIZE and rows == sorted(rows)
    assert set(rows) == set(range(620)) - test - dev
    assert all(r.text == f"tweet {row}" and r.gold == labels[row] for r, row in zip(rest, rows))


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside this checkout")
def test_irony_leaves_284_rows_outside_both_shipped_samples():
    rest = unsampled_records(SHARED, "irony")
    shipped = {r.id for split in ("test", "dev") for r in load_sample("irony", split)}
    assert len(rest) == 784 - 500 == 284 and not {r.id for r in rest} & shipped
