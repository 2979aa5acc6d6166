"""Metric names used by the Grafana dashboard's PromQL, for the tests that check them against scrapes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dashboard.json"
METRIC = re.compile(r"\b((?:decide_|vllm:)[A-Za-z0-9_:]+)")


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def dashboard_metric_names() -> set[str]:
    return {name for expr in dashboard_expressions() for name in METRIC.findall(expr)}


def scraped_sample_names(text: str) -> set[str]:
    """Every sample name in a Prometheus text scrape (…_bucket, …_count, …_total included)."""
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
