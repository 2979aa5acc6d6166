"""KV-cache capacity and memory lines from vLLM start-up logs, for run manifests and the survey.

… KV cache size: 23,296 tokens, Maximum concurrency for 8,192 tokens per request: 2.84x
(vLLM's device word — "GPU" for CUDA, else the device type upper-cased — optionally "+ host", or none)
… Memory statistics | total_hbm_limit_gb=15.75GiB | total_hbm_limit_cap_gb=14.49GiB | total_hbm_used_gb=…GiB | total_hbm_avail_gb=…GiB
(the TPU backend's line: tpu_inference/worker/tpu_worker.py, ``determine_available_memory``,
written with f-string ``{name=}`` fields, so every field is ``name=valueGiB``)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

KV_LINE = re.compile(
    r"(?:\b(?P<device>GPU|CPU|TPU|XPU|HPU|NPU)(?: \+ host)? )?KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<per_request>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)
MEMORY_MARKER = "Memory statistics"
MEMORY_FIELD = re.compile(r"(?P<name>[a-z_]+)_gb=(?P<value>-?[\d.]+)GiB")


def parse_kv_capacity(log: str) -> dict | None:
    """The last KV-capacity line of a start-up log (tokens, tokens per request, max concurrency)."""
    found = None
    for match in KV_LINE.finditer(log):
        found = {
            "device": match["device"],
            "kv_cache_tokens": int(match["tokens"].replace(",", "")),
            "max_model_len": int(match["per_request"].replace(",", "")),
            "max_concurrency": float(match["concurrency"]),
        }
    return found


def parse_memory_statistics(log: str) -> dict | None:
    """The last TPU "Memory statistics" line: its GiB fields (``total_hbm_limit_gib``, …) and the line verbatim.

    Fields are read by name, so a backend that adds or drops one still parses; a line with no
    ``…_gb=…GiB`` field at all is kept verbatim only.
    """
    found = None
    for line in log.splitlines():
        if MEMORY_MARKER not in line:
            continue
        text = line[line.index(MEMORY_MARKER) :].strip()
        fields = {f"{m['name']}_gib": float(m["value"]) for m in MEMORY_FIELD.finditer(text)}
        found = {**fields, "line": text}
    return found


def read_engine_log(log: str) -> dict:
    """What a start-up log says about capacity, for a run manifest: ``kv_capacity`` and ``memory_statistics``."""
    return {"kv_capacity": parse_kv_capacity(log), "memory_statistics": parse_memory_statistics(log)}


def measured_capacity(path: Path) -> dict:
    """Measured capacity from a server start-up log, or from a run manifest (or run directory) that
    recorded one; ``source`` names the file. Raises ValueError, saying why, when there is none."""
    if path.is_dir():
        path = path / "manifest.json"
    text = path.read_text(errors="replace")
    if path.suffix != ".json":
        found = read_engine_log(text)
        if not found["kv_capacity"] and not found["memory_statistics"]:
            raise ValueError(f"{path}: no 'KV cache size' or 'Memory statistics' line")
        return {**found, "source": str(path)}
    manifest = json.loads(text)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a run manifest (a JSON object)")
    memory = manifest.get("memory_statistics")
    if isinstance(memory, list):  # manifests before 2026-11-29 kept the lines verbatim
        memory = parse_memory_statistics("\n".join(memory))
    if not manifest.get("kv_capacity") and not memory:
        raise ValueError(
            f"{path}: the manifest recorded no server capacity (was the run given --engine-log?)"
        )
    return {"kv_capacity": manifest.get("kv_capacity"), "memory_statistics": memory, "source": str(path)}
