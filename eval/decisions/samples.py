"""Build the shipped task samples, test, dev and fresh, from the upstream files in ``../shared/data``.

Test: 300 records per sample, stratified by class with proportional allocation (largest remainders),
drawn with a fixed seed, written in upstream row order. Dev: 200 more, stratified the same way with
the next seed, from the rows the test sample does not hold (SST-5, which has its own dev split
upstream: from that split). Fresh: up to 300 more, stratified with the seed after that, from the
rows neither holds (:func:`unsampled_records`; irony has 284, all taken): records kept out of every
choice and report until a rule written first reads them once (evidence/few-shot/round-5/rule.md). Record ids are ``<sample>-<row index>`` with the 0-based row of the
upstream split (SST-5 dev: ``sst5-dev-<row>``). Texts are stripped of surrounding whitespace (the
upstream SST-2 and TweetEval files keep a trailing space that the Hugging Face copies do not). AG
News text is ``title + " " + description``. SST-5's Penn Treebank brackets ``-LRB-``/``-RRB-`` are
written as the parentheses they stand for; its tokenisation is otherwise kept, as SST-2's is.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from eval.decisions.tasks import Record, sample_file

SAMPLE_SIZE = 300
SEED = 20260924
DEV_SIZE = 200
DEV_SEED = SEED + 1
FRESH_SIZE = 300
FRESH_SEED = SEED + 2

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
    "sst5": {
        "files": ["sst5/classes/test.txt"],
        "dev_files": ["sst5/classes/dev.txt"],
        "upstream": "neubig/nn4nlp-code data/classes/{test,dev}.txt @ 970d91a51664b3d91a9822b61cd76abea20218cb "
        "(Stanford Sentiment Treebank, root labels 0-4)",
        "licence": "repo Apache-2.0 (Graham Neubig, 2017); data: cite Socher et al. 2013; no separate data terms stated",
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


def _sst5_split(data: Path, split: str) -> list[tuple[str, str]]:
    rows = []
    for line in (data / f"sst5/classes/{split}.txt").read_text(encoding="utf-8").splitlines():
        label, _, sentence = line.partition(" ||| ")
        rows.append((sentence.replace("-LRB-", "(").replace("-RRB-", ")"), label))
    return rows


def _sst5(data: Path) -> list[tuple[str, str]]:
    return _sst5_split(data, "test")


READERS: dict[str, Callable[[Path], list[tuple[str, str]]]] = {
    "sst2": _sst2,
    "ag_news": _ag_news,
    "emotion": _emotion,
    "irony": _irony,
    "sst5": _sst5,
}
DEV_READERS: dict[str, Callable[[Path], list[tuple[str, str]]]] = {
    "sst5": lambda data: _sst5_split(data, "dev"),
}
"""Samples whose upstream has a dev split of its own; the others' dev records come from the rows
the test sample leaves."""


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


def dev_rows(data: Path, sample: str) -> tuple[str, list[tuple[str, str]], list[int]]:
    """(id prefix, upstream rows, the dev sample's row indices) of a sample's dev split."""
    if sample in DEV_READERS:
        rows = DEV_READERS[sample](data)
        return f"{sample}-dev", rows, stratified_rows([label for _, label in rows], DEV_SIZE, DEV_SEED)
    rows = READERS[sample](data)
    shipped = set(stratified_rows([label for _, label in rows], SAMPLE_SIZE, SEED))
    rest = [row for row in range(len(rows)) if row not in shipped]
    picked = stratified_rows([rows[row][1] for row in rest], DEV_SIZE, DEV_SEED)
    return sample, rows, [rest[i] for i in picked]


def unsampled_records(data: Path, sample: str) -> list[Record]:
    """The upstream rows of ``sample`` that neither shipped split holds, in upstream order, ids and
    texts as the samples write them: records no read default was chosen on or reported on (irony:
    284 of TweetEval's 784 test rows). SST-5's dev records come from another split, so its rest is
    every test row outside the test sample."""
    rows = READERS[sample](data)
    held = set(stratified_rows([label for _, label in rows], SAMPLE_SIZE, SEED))
    if sample not in DEV_READERS:
        held |= set(dev_rows(data, sample)[2])
    return [
        Record(id=f"{sample}-{row}", task=sample, text=text.strip(), gold=gold)
        for row, (text, gold) in enumerate(rows)
        if row not in held
    ]


def fresh_records(data: Path, sample: str) -> list[Record]:
    """The fresh split: up to ``FRESH_SIZE`` of :func:`unsampled_records`, stratified by class with
    ``FRESH_SEED``, in upstream order."""
    rest = unsampled_records(data, sample)
    if len(rest) <= FRESH_SIZE:
        return rest
    return [rest[i] for i in stratified_rows([r.gold for r in rest], FRESH_SIZE, FRESH_SEED)]


def _write(records: list[Record], path: Path) -> bytes:
    payload = "".join(json.dumps(record.__dict__, ensure_ascii=False) + "\n" for record in records).encode()
    path.write_bytes(payload)
    return payload


def build_samples(data: Path, out: Path) -> dict:
    """Write ``<sample>.jsonl`` (test), ``<sample>.dev.jsonl`` and ``<sample>.fresh.jsonl`` for every
    sample and ``MANIFEST.json``; returns the manifest."""
    manifest = {
        "sample_size": SAMPLE_SIZE,
        "seed": SEED,
        "dev_size": DEV_SIZE,
        "dev_seed": DEV_SEED,
        "fresh_size": FRESH_SIZE,
        "fresh_seed": FRESH_SEED,
        "allocation": "proportional, largest remainders",
        "tasks": {},
    }
    for sample, read in READERS.items():
        rows = read(data)
        picked = stratified_rows([label for _, label in rows], SAMPLE_SIZE, SEED)
        records = [
            Record(id=f"{sample}-{row}", task=sample, text=rows[row][0].strip(), gold=rows[row][1])
            for row in picked
        ]
        payload = _write(records, out / sample_file(sample, "test"))
        prefix, upstream, dev_picked = dev_rows(data, sample)
        dev = [
            Record(id=f"{prefix}-{row}", task=sample, text=upstream[row][0].strip(), gold=upstream[row][1])
            for row in dev_picked
        ]
        dev_payload = _write(dev, out / sample_file(sample, "dev"))
        fresh = fresh_records(data, sample)
        fresh_payload = _write(fresh, out / sample_file(sample, "fresh"))
        source = SOURCES[sample]
        files = source["files"] + source.get("dev_files", [])
        manifest["tasks"][sample] = {
            "records": len(records),
            "classes": dict(sorted(Counter(record.gold for record in records).items())),
            "dev_records": len(dev),
            "dev_classes": dict(sorted(Counter(record.gold for record in dev).items())),
            "upstream": source["upstream"],
            "licence": source["licence"],
            "source_sha256": {name: sha256_bytes((data / name).read_bytes()) for name in files},
            "sample_sha256": sha256_bytes(payload),
            "dev_sha256": sha256_bytes(dev_payload),
            "fresh_records": len(fresh),
            "fresh_classes": dict(sorted(Counter(record.gold for record in fresh).items())),
            "fresh_sha256": sha256_bytes(fresh_payload),
        }
    (out / "MANIFEST.json").write_text(
        json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return manifest
