"""Build the shipped task samples from the upstream files in ``../shared/data``.

300 records per task, stratified by class with proportional allocation (largest remainders), drawn
with a fixed seed, written in upstream row order. Record ids are ``<task>-<row index>`` with the
0-based row of the upstream split. Texts are stripped of surrounding whitespace (the upstream SST-2 and
TweetEval files keep a trailing space that the Hugging Face copies do not). AG News text is
``title + " " + description``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from eval.tasks import Record

SAMPLE_SIZE = 300
SEED = 20260924

SOURCES = {
    "sst2": {
        "files": ["sst2/dev.tsv"],
        "upstream": "forest-snow/alps data/SST-2/test.tsv @ 43232f234087cdbb4b06cd0e3997460610a0dbfd (GLUE SST-2 dev)",
        "licence": "repo MIT (Michelle Yuan, 2020); data: cite Socher et al. 2013; no separate data terms stated",
    },
    "ag_news": {
        "files": ["ag_news/test.csv", "ag_news/classes.txt"],
        "upstream": "mhjabreel/CharCnn_Keras data/ag_news_csv @ 555590db4219b1243abb1918effd6a7425a2d75f",
        "licence": "AG corpus readme: provided for research purposes and other non-commercial activity",
    },
    "emotion": {
        "files": ["emotion/test.jsonl"],
        "upstream": "chanys/tnlp data/emotion/test.jsonl @ ea317b02aabfca9313e4ccdf0ac2bb6759fe0cac (HF dair-ai/emotion test)",
        "licence": "repo Apache-2.0; dataset: free to use for educational and research purposes (HF card: other)",
    },
    "irony": {
        "files": ["irony/test_text.txt", "irony/test_labels.txt", "irony/mapping.txt"],
        "upstream": "cardiffnlp/tweeteval datasets/irony @ 4fbd22cd78421f05b1ecdb4fc5725bc7a7bd8f66",
        "licence": "TweetEval: released without restrictions; SemEval-2018 Task 3 and Twitter terms may apply",
    },
}


def _sst2(data: Path) -> list[tuple[str, str]]:
    with (data / "sst2/dev.tsv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [(sentence, ("negative", "positive")[int(label)]) for sentence, label in rows]


def _ag_news(data: Path) -> list[tuple[str, str]]:
    classes = (data / "ag_news/classes.txt").read_text(encoding="utf-8").split()
    with (data / "ag_news/test.csv").open(encoding="utf-8", newline="") as handle:
        return [
            (f"{title} {description}", classes[int(label) - 1])
            for label, title, description in csv.reader(handle)
        ]


def _emotion(data: Path) -> list[tuple[str, str]]:
    lines = (data / "emotion/test.jsonl").read_text(encoding="utf-8").splitlines()
    return [(row["text"], row["label"]) for row in map(json.loads, lines)]


def _irony(data: Path) -> list[tuple[str, str]]:
    texts = (data / "irony/test_text.txt").read_text(encoding="utf-8").split("\n")
    labels = (data / "irony/test_labels.txt").read_text(encoding="utf-8").split()
    return [(text, ("false", "true")[int(label)]) for text, label in zip(texts, labels)]


READERS: dict[str, Callable[[Path], list[tuple[str, str]]]] = {
    "sst2": _sst2,
    "ag_news": _ag_news,
    "emotion": _emotion,
    "irony": _irony,
}


def stratified_rows(labels: list[str], size: int, seed: int) -> list[int]:
    """Row indices: ``size`` rows with each class in proportion to its share (largest remainders)."""
    by_class: dict[str, list[int]] = defaultdict(list)
    for row, label in enumerate(labels):
        by_class[label].append(row)
    quotas = {label: size * len(rows) / len(labels) for label, rows in by_class.items()}
    counts = {label: int(quota) for label, quota in quotas.items()}
    for label in sorted(quotas, key=lambda name: (-(quotas[name] - counts[name]), name))[
        : size - sum(counts.values())
    ]:
        counts[label] += 1
    rng = random.Random(seed)
    chosen = [row for label in sorted(by_class) for row in rng.sample(by_class[label], counts[label])]
    return sorted(chosen)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_samples(data: Path, out: Path) -> dict:
    """Write ``<task>.jsonl`` for every task and ``MANIFEST.json``; returns the manifest."""
    manifest = {
        "sample_size": SAMPLE_SIZE,
        "seed": SEED,
        "allocation": "proportional, largest remainders",
        "tasks": {},
    }
    for task, read in READERS.items():
        rows = read(data)
        picked = stratified_rows([label for _, label in rows], SAMPLE_SIZE, SEED)
        records = [
            Record(id=f"{task}-{row}", task=task, text=rows[row][0].strip(), gold=rows[row][1])
            for row in picked
        ]
        payload = "".join(
            json.dumps(record.__dict__, ensure_ascii=False) + "\n" for record in records
        ).encode()
        (out / f"{task}.jsonl").write_bytes(payload)
        classes: dict[str, int] = defaultdict(int)
        for record in records:
            classes[record.gold] += 1
        source = SOURCES[task]
        manifest["tasks"][task] = {
            "records": len(records),
            "classes": dict(sorted(classes.items())),
            "upstream": source["upstream"],
            "licence": source["licence"],
            "source_sha256": {name: sha256_bytes((data / name).read_bytes()) for name in source["files"]},
            "sample_sha256": sha256_bytes(payload),
        }
    (out / "MANIFEST.json").write_text(
        json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return manifest
