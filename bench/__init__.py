"""Benchmarks printing ratios measured side by side in one run; each runs as a module from the repository
root, e.g. ``.venv/bin/python -m bench.latency --help``. Its docstring gives the exact commands.

Acceptance tools (PASS/FAIL against a goal: the probe, the soak, the fault runs) are in deploy/acceptance/.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the services a benchmark starts run from it
