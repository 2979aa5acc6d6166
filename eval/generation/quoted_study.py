"""The study's published generation (GSM8K, BFCL) and quantization (QAT builds) tables, quoted.

Two table families of xbill9/gemma4-dev ship as data under ``eval/data/reference/``, one row per
published table row, each with the table's cells as published (``columns``), its source (repository,
path, commit, URL) and date:

- ``study-generation.json``: the paired GSM8K / BFCL v3 simple comparisons of the QAT builds on one
  TPU v5e chip (``jev-tpu-v5e1/evidence-v5e1/2026-09-30-*``; answer limit 2,048 tokens, and a
  768-token GSM8K run), reference and test accuracy, difference with its 95% range and the discordant
  counts;
- ``study-quantization.json``: QUANTIZATION.md's v5e table (suite accuracy against bf16 and output
  tokens/s at 1 / 4 / 16 requests per build) and its two v6e tables of Google's W4A16 exports (suite
  against bf16; HBM, KV cache and output tokens/s through the W4A16 kernel).

The numeric fields are parsed from ``columns`` by the functions below (a test re-derives them, and
recomputes each difference from the discordant counts), so nothing here is typed twice. The study's
v6e model sweep of 2026-09-24 read decisions only (:mod:`eval.generation.quoted_sweep`); its ``jev-tpu/RESULTS.md``
holds no GSM8K, BFCL or generation-throughput figure, so none is quoted for its arms.

Every printed row says "quoted": none of it was measured here.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

GENERATION = "study-generation.json"
QUANTIZATION = "study-quantization.json"
_COMPARISON = re.compile(r"(?P<test>.+) (?P<task>gsm8k|bfcl_simple) vs (?P<reference>.+)")
_RANGE = re.compile(r"(?P<lo>[-+]?[\d.]+) to (?P<hi>[-+]?[\d.]+)")
# QUANTIZATION.md writes signs with U+2212; the evidence files with ASCII.
_POINTS = r"[−+-][\d.]+"
_SUITE = re.compile(rf"(?P<acc>[\d.]+)(?: \((?P<d>{_POINTS}), (?P<lo>{_POINTS}) to (?P<hi>{_POINTS})\))?")
_W4A16 = re.compile(rf"(?P<d>{_POINTS}) pts \((?P<lo>{_POINTS}) to (?P<hi>{_POINTS})\)")
_BUILD = re.compile(r"`([^`]+)`")


def _number(text: str) -> float:
    return float(text.replace("−", "-").replace("+", ""))


def parse_generation(columns: dict[str, str]) -> dict[str, Any]:
    """The numbers of one row of a study ``*-GEN-*.md`` / ``*-GEN768-*.md`` comparison table."""
    names = _COMPARISON.fullmatch(columns["comparison"])
    interval = _RANGE.fullmatch(columns["95% range"])
    if names is None or interval is None:
        raise ValueError(f"not a study comparison row: {columns}")
    return {
        "test": names["test"],
        "task": names["task"],
        "reference": names["reference"],
        "n": int(columns["n"]),
        "reference_accuracy": float(columns["reference"]),
        "test_accuracy": float(columns["test"]),
        "difference": float(columns["difference"]),
        "difference_range": [float(interval["lo"]), float(interval["hi"])],
        "reference_only": int(columns["ref only"]),
        "test_only": int(columns["test only"]),
    }


def parse_quantization(table: str, columns: dict[str, str]) -> dict[str, Any]:
    """The numbers of one row of QUANTIZATION.md's v5e build table or one of its v6e W4A16 tables."""
    if table == "v5e-builds":
        suite = _SUITE.fullmatch(columns["Suite (vs bf16, points, 95% range)"])
        build = _BUILD.search(columns["Build (slot 5)"])
        if suite is None:
            raise ValueError(f"not a v5e build row: {columns}")
        speeds = columns["Output tok/s at 1 / 4 / 16"].split(" / ")
        return {
            "size": columns["Size"],
            "build": build[1] if build else columns["Build (slot 5)"].split(" ")[0],
            "suite_accuracy": float(suite["acc"]),
            "difference_points": _number(suite["d"]) if suite["d"] else None,
            "difference_range_points": [_number(suite["lo"]), _number(suite["hi"])] if suite["d"] else None,
            "output_tokens_per_s": {
                level: int(value.replace(",", ""))
                for level, value in zip(("1", "4", "16"), speeds, strict=True)
            },
        }
    if table == "v6e-w4a16":
        difference = _W4A16.fullmatch(columns["Difference (95% bootstrap range)"])
        return {
            "size": columns["Model"],
            "build": "-qat-w4a16-ct",
            "bf16_accuracy": None
            if columns["bf16"] == "—"
            else round(_number(columns["bf16"][:-1]) / 100, 6),
            "suite_accuracy": round(_number(columns["W4A16"][:-1]) / 100, 6),
            "difference_points": _number(difference["d"]) if difference else None,
            "difference_range_points": [_number(difference["lo"]), _number(difference["hi"])]
            if difference
            else None,
        }
    if table == "v6e-w4a16-speed":
        model = _BUILD.search(columns["Model"])
        ratio = columns["vs bf16"]
        return {
            "size": columns["Model"].split(" ")[0],
            "build": model[1] if model else columns["Model"],
            "hbm_gib": float(columns["HBM used"].removesuffix(" GiB")),
            "kv_tokens": int(columns["KV cache"].removesuffix(" tokens").replace(",", "")),
            "output_tokens_per_s": {"16": int(columns["Output tok/s"].replace(",", ""))},
            "speed_vs_bf16": float(ratio[:-1]) if ratio.endswith("x") else None,
        }
    raise ValueError(f"unknown quoted quantization table {table!r}")


def _load(name: str) -> list[dict[str, Any]]:
    return json.loads(resources.files("eval.data.reference").joinpath(name).read_text(encoding="utf-8"))


def generation_rows() -> list[dict[str, Any]]:
    return _load(GENERATION)


def quantization_rows() -> list[dict[str, Any]]:
    return _load(QUANTIZATION)


def _sources(rows: list[dict[str, Any]]) -> list[str]:
    """One line per distinct source file, in row order."""
    cited = (
        f"- `{row['source']['path']}` @ `{row['source']['commit'][:8]}`: {row['source']['url']}"
        for row in rows
    )
    return list(dict.fromkeys(cited))


def _section(intro: str, header: list[str], right: set[int], cells: list[list[str]]) -> list[str]:
    """An intro line and a Markdown table; the columns numbered in ``right`` align right."""
    rule = "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"
    return [intro, "", "| " + " | ".join(header) + " |", rule, *("| " + " | ".join(c) + " |" for c in cells)]


def generation_table(rows: list[dict[str, Any]] | None = None) -> str:
    """The study's GSM8K / BFCL comparisons as Markdown, every row labelled quoted."""
    rows = generation_rows() if rows is None else rows
    cells = [
        [
            f"{row['test']} (quoted)",
            row["task"],
            f"{row['max_tokens']:,}",
            f"{row['n']:,}",
            row["reference"],
            f"{row['reference_accuracy']:.3f}",
            f"{row['test_accuracy']:.3f}",
            f"{row['difference']:+.3f} ({row['difference_range'][0]:+.3f} to {row['difference_range'][1]:+.3f})",
            f"{row['reference_only']} / {row['test_only']}",
            f"study {row['date']}",
        ]  # fmt: skip
        for row in rows
    ]
    lines = _section(
        "Quoted, not measured here: the study's GSM8K and BFCL v3 simple reads of its QAT builds on one TPU "
        "v5e chip (xbill9/gemma4-dev), paired per problem; 95% range from 10,000 bootstrap resamples.",
        ["test (quoted)", "task", "max tokens", "n", "reference", "reference acc.", "test acc.", "Δ (95% range)",
         "ref only / test only", "source, date"],
        {2, 3, 5, 6, 8},
        cells,
    )  # fmt: skip
    return "\n".join([*lines, "", "Sources:", *_sources(rows)]) + "\n"


def _points(value: float) -> str:
    return f"{value:+.1f}".replace("-", "−")


def _delta_points(row: dict[str, Any], absent: str) -> str:
    if row["difference_points"] is None:
        return absent
    lo, hi = row["difference_range_points"]
    return f"{_points(row['difference_points'])} ({_points(lo)} to {_points(hi)})"


def quantization_table(rows: list[dict[str, Any]] | None = None) -> str:
    """The study's QAT build tables as Markdown, every row labelled quoted."""
    rows = quantization_rows() if rows is None else rows
    table = {
        name: [row for row in rows if row["table"] == name]
        for name in ("v5e-builds", "v6e-w4a16", "v6e-w4a16-speed")
    }
    lines = _section(
        "Quoted, not measured here: the study's builds of Google's QAT weights on one TPU v5e chip (the "
        "3,880-record public suite paired per record against bf16, points with 95% range; output tokens/s "
        "at 1 / 4 / 16 requests). E4B and 12B were paired against bf16 read on a v6e chip.",
        ["size", "build (quoted)", "suite", "Δ vs bf16, points (95% range)", "output tok/s at 1 / 4 / 16",
         "source, date"],
        {2, 4},
        [
            [row["size"], f"{row['build']} (quoted)", f"{row['suite_accuracy']:.3f}", _delta_points(row, "reference"),
             " / ".join(f"{row['output_tokens_per_s'][level]:,}" for level in ("1", "4", "16")),
             f"study {row['measured']}"]
            for row in table["v5e-builds"]
        ],
    )  # fmt: skip
    lines += ["", *_section(
        "Quoted, not measured here: Google's `-qat-w4a16-ct` exports against their bf16 checkpoints on one "
        "TPU v6e chip, the same suite paired per record.",
        ["size", "build (quoted)", "bf16", "W4A16", "Δ, points (95% range)", "source, date"],
        {2, 3},
        [
            [row["size"], f"{row['build']} (quoted)",
             "does not fit one chip" if row["bf16_accuracy"] is None else f"{row['bf16_accuracy']:.1%}",
             f"{row['suite_accuracy']:.1%}", _delta_points(row, "—"), f"study {row['measured']}"]
            for row in table["v6e-w4a16"]
        ],
    )]  # fmt: skip
    lines += ["", *_section(
        "Quoted, not measured here: the same exports' speed on one TPU v6e chip through the W4A16 kernel "
        "(16 concurrent requests of 256 output tokens, median of 3 passes).",
        ["size", "build (quoted)", "HBM used", "KV cache tokens", "output tok/s at 16", "× bf16", "source, date"],
        {2, 3, 4, 5},
        [
            [row["size"], f"{row['build']} (quoted)", f"{row['hbm_gib']:.2f} GiB", f"{row['kv_tokens']:,}",
             f"{row['output_tokens_per_s']['16']:,}",
             "bf16 does not fit" if row["speed_vs_bf16"] is None else f"{row['speed_vs_bf16']:.2f}",
             f"study {row['measured']}"]
            for row in table["v6e-w4a16-speed"]
        ],
    )]  # fmt: skip
    return "\n".join([*lines, "", "Sources:", *_sources(rows)]) + "\n"


# The docs hold each quoted table between these markers; `python -m eval.generation.quoted_study --write`
# regenerates them from the data, and a test keeps them equal.
DOCS = {
    Path("docs") / "generation.md": ("generation", generation_table),
    Path("docs") / "quantization.md": ("quantization", quantization_table),
}


def _marked(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- quoted: {name} \(generated by python -m eval\.generation\.quoted_study --write\) -->\n)"
                      r"(.*?)(<!-- /quoted -->)", re.S)  # fmt: skip


def docs_section(text: str, name: str) -> str | None:
    """The text between a doc's markers for the quoted table NAME (None without markers)."""
    found = _marked(name).search(text)
    return None if found is None else found[2]


def write_docs(root: Path) -> list[Path]:
    written = []
    for relative, (name, render) in DOCS.items():
        path = root / relative
        text = path.read_text(encoding="utf-8")
        found = _marked(name).search(text)
        if found is None:
            raise ValueError(f"{path} has no '<!-- quoted: {name} ... -->' marker")
        new = text[: found.start(2)] + "\n" + render() + "\n" + text[found.end(2) :]
        if new != text:
            path.write_text(new, encoding="utf-8")
            written.append(path)
    return written


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        raise SystemExit(
            "usage: python -m eval.generation.quoted_study --write   (regenerate the docs' quoted tables)"
        )
    for path in write_docs(Path(__file__).resolve().parents[2]):
        print(f"wrote {path}")
