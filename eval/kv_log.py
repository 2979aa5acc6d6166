"""KV-cache capacity and memory lines from vLLM start-up logs, for run manifests and the survey.

    … KV cache size: 23,296 tokens, Maximum concurrency for 8,192 tokens per request: 2.84x
    (any device prefix: "CPU KV cache size", "GPU KV cache size", or none)
    … Memory statistics | …   (the TPU backend's memory line, kept verbatim)
"""

from __future__ import annotations

import re

KV_LINE = re.compile(
    r"(?P<device>[A-Z]+ )?KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<per_request>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)


def parse_kv_capacity(log: str) -> dict | None:
    """The last KV-capacity line of a start-up log (tokens, tokens per request, max concurrency)."""
    found = None
    for match in KV_LINE.finditer(log):
        found = {
            "device": (match["device"] or "").strip() or None,
            "kv_cache_tokens": int(match["tokens"].replace(",", "")),
            "max_model_len": int(match["per_request"].replace(",", "")),
            "max_concurrency": float(match["concurrency"]),
        }
    return found


def memory_statistics(log: str) -> list[str]:
    """Every "Memory statistics | …" line, verbatim from its marker on."""
    return [line[line.index("Memory statistics"):].strip() for line in log.splitlines() if "Memory statistics" in line]
