"""The load sweep through the service on the embedded model (small sizes), and its summary."""

from __future__ import annotations

import pytest

from eval.capacity.cost import throughput_of_run
from eval.capacity.sweep import long_states, plot_sweep, run_sweep, summarise, sweep_table
from service.app import create_app

pytestmark = pytest.mark.anyio


def test_long_states_are_unique_and_about_the_asked_length(tokenizer):
    states = long_states(tokenizer, 1024, 3)
    assert len(set(states)) == 3 and len({s.split()[1] for s in states}) == 3  # unique from the first words
    for state in states:
        assert 1000 <= len(tokenizer.encode(state, add_special_tokens=False)) <= 1030


@pytest.mark.slow  # 48 reads, two of them 1,024-token states
async def test_sweep_rows_summary_figure_and_cost_input(local_engine, tmp_path):
    rows = await run_sweep(
        local_engine,
        tmp_path,
        service_app=create_app,
        concurrencies=(1, 8),
        passes=2,
        requests=8,
        long_tokens=(1024,),
        long_requests=2,
        long_concurrency=2,
    )
    assert {(r["shape"], r["concurrency"]) for r in rows} == {("short", 1), ("short", 8), ("long-1024", 2)}
    assert all(r["failed"] == 0 and r["completed"] == r["requests"] for r in rows)
    summary = summarise(rows)
    long_row = next(s for s in summary if s["shape"] == "long-1024")
    assert long_row["prompt_tokens_median"] > 1024 and long_row["passes"] == 2
    (tmp_path / "summary.json").write_text(__import__("json").dumps(summary))
    plot_sweep(summary, tmp_path / "load.png", "test")
    assert (tmp_path / "load.png").stat().st_size > 0 and "| short |" in sweep_table(summary)
    throughput = throughput_of_run(tmp_path, label="cpu", chip="cpu", concurrency=8)
    short8 = next(s for s in summary if s["shape"] == "short" and s["concurrency"] == 8)
    assert throughput.decisions_per_s == short8["decisions_per_s"]


@pytest.mark.slow  # a load sweep through the service on the embedded model
async def test_load_sweep_opens_the_engine_and_writes_the_report(tmp_path):
    """What ``decide eval load`` calls: engine by spec, sweep, then summary.json, load.md and load.png."""
    import json

    from eval.capacity.sweep import load_sweep
    from eval.evidence.manifest import Images

    summary = await load_sweep(
        "local",
        tmp_path,
        service_app=create_app,
        concurrencies=(2,),
        passes=1,
        requests=4,
        long_tokens=(),
        images=Images(service="decide@sha256:s"),
    )
    assert [(s["shape"], s["concurrency"], s["failed"]) for s in summary] == [("short", 2, 0)]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "load.md").read_text() == sweep_table(summary) and (
        tmp_path / "load.png"
    ).stat().st_size > 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["run"] == "load" and manifest["images"] == {"engine": None, "service": "decide@sha256:s"}
