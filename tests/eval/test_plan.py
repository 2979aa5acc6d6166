"""Capacity planning from measured load sweeps: the queueing model on hand-checkable curves."""

from __future__ import annotations

import json
import math

import pytest

from eval.capacity.cost import Price, load_prices
from eval.capacity.plan import (
    OperatingPoint,
    Sweep,
    closed_loop_p99_ms,
    plan_chip,
    plan_fleet,
    plan_table,
    predicted_p99_ms,
    read_sweep,
    waiting_p99_ms,
)

# A chip that does 10/s at c=1 (p99 100 ms), 30/s at c=4 (200 ms), 40/s at c=8 (400 ms), saturated at c=16.
SWEEP = Sweep(
    "l4",
    (
        OperatingPoint(1, 10.0, 100.0),
        OperatingPoint(4, 30.0, 200.0),
        OperatingPoint(8, 40.0, 400.0),
        OperatingPoint(16, 39.0, 900.0),
    ),
    132,
    "test",
)
PRICE = Price("l4-test", "l4", 0.72, "on-demand", "test", "2026-11-29")


def test_p99_is_the_closed_loop_latency_plus_the_wait_random_arrivals_add():
    assert closed_loop_p99_ms(SWEEP, 35.0) == pytest.approx(
        300.0
    )  # halfway between 30/s (200) and 40/s (400)
    assert closed_loop_p99_ms(SWEEP, 2.0) == 100.0  # below the lowest load: the lightest measured p99
    assert closed_loop_p99_ms(SWEEP, 40.5) is None  # the saturated c=16 point adds no rate
    # M/M/1 at λ = 35 against the 40/s peak: ρ = 0.875, p99 wait = ln(87.5) / 5 s
    assert waiting_p99_ms(35.0, 40.0) == pytest.approx(math.log(87.5) / 5 * 1000)
    assert predicted_p99_ms(SWEEP, 35.0) == pytest.approx(300.0 + math.log(87.5) / 5 * 1000)
    assert predicted_p99_ms(SWEEP, 40.0) is None


def test_fewest_chips_within_utilisation_and_p99():
    # 100/s: the 0.8 cap allows 32/s per chip, so ≥ 4 chips; 5 chips → 20/s: 150 ms + ln(50)/20 s = 345.6 ms.
    plan = plan_chip(SWEEP, 100.0, 350.0, [PRICE])
    assert (plan.chips, plan.replicas, plan.rate_per_chip) == (5, 5, 20.0)
    assert plan.predicted_p99_ms == pytest.approx(150.0 + math.log(50) / 20 * 1000)
    # A tighter p99 needs more chips: 8 chips → 12.5/s: 112.5 ms + ln(31.25)/27.5 s = 237.7 ms (7 give 260.5).
    tight = plan_chip(SWEEP, 100.0, 250.0, [PRICE])
    assert tight.chips == 8 and tight.predicted_p99_ms == pytest.approx(112.5 + math.log(31.25) / 27.5 * 1000)
    ((price, per_hour, per_million),) = tight.costs
    assert per_hour == pytest.approx(8 * 0.72) and per_million == pytest.approx(8 * 0.72 / 3600 / 100 * 1e6)


def test_a_p99_below_the_lightest_measured_load_cannot_be_met_and_says_why():
    plan = plan_chip(SWEEP, 100.0, 50.0, [PRICE])
    assert plan.chips is None and "100 ms > 50 ms" in plan.note


def test_replicas_have_a_floor_for_availability():
    assert plan_chip(SWEEP, 5.0, 500.0, [PRICE]).replicas == 2


def test_table_names_unmeasured_chips_and_jev(tmp_path):
    summary = [
        {"shape": "short", "concurrency": c, "decisions_per_s": x, "p99_ms": p, "prompt_tokens_median": 132}
        for c, x, p in [(1, 10.0, 100.0), (4, 30.0, 200.0)]
    ] + [
        {
            "shape": "long-1024",
            "concurrency": 4,
            "decisions_per_s": 2.0,
            "p99_ms": 5000.0,
            "prompt_tokens_median": 1024,
        }
    ]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    sweep = read_sweep(tmp_path, chip="l4")
    assert [p.concurrency for p in sweep.points] == [1, 4] and sweep.prompt_tokens_median == 132
    prices, jev = load_prices()
    table = plan_table(
        [plan_chip(sweep, 20.0, 300.0, prices)],
        rate=20.0,
        p99_ms=300.0,
        unmeasured=["v6e", "v5e"],
        jev=jev,
        prompt_tokens=132,
    )
    assert (
        "| l4 | 2 | 2 | 275 |" in table
    )  # 10/s each: 100 ms + ln(33.3)/20 s and "gcp-g2-standard-4-on-demand-us-central1" in table
    assert "not sized: v6e, v5e" in table and "Jev at 132 prompt tokens" in table


def test_decide_plan_sizes_a_measured_chip_and_refuses_a_malformed_sweep(tmp_path):
    from typer.testing import CliRunner

    from opendecide.cli import app

    summary = [
        {"shape": "short", "concurrency": c, "decisions_per_s": x, "p99_ms": p, "prompt_tokens_median": 60}
        for c, x, p in [(1, 10.0, 100.0), (8, 40.0, 400.0)]
    ]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    result = CliRunner().invoke(
        app, ["plan", "--rate", "64", "--p99", "300", "--sweep", f"l4={tmp_path}", "--chips", "l4,v6e"]
    )
    assert result.exit_code == 0, result.output
    # 64/s: ≥ 2 chips by the 0.8 cap; 4 chips → 16/s: 160 ms + ln(40)/24 s = 314 ms; 5 → 12.8/s: 128 + 127 = 255 ms.
    assert "| l4 | 5 | 5 | 255 |" in result.output and "not sized: v6e" in result.output
    bad = CliRunner().invoke(app, ["plan", "--rate", "1", "--p99", "300", "--sweep", "l4"])
    assert bad.exit_code == 2 and "is not CHIP=RUN" in bad.output


@pytest.mark.parametrize(
    "target, options, named",
    [
        ((0, 300), {}, "--rate"),
        ((10, -1), {}, "--p99"),
        ((10, 300), {"max_utilisation": 0}, "--max-utilisation"),
        ((10, 300), {"max_utilisation": 1.2}, "--max-utilisation"),
        ((10, 300), {"sweeps": ["l4"]}, "--sweep 'l4' is not CHIP=RUN"),
    ],
)
def test_plan_fleet_names_the_option_it_refuses(target, options, named, tmp_path):
    # A --sweep run that does not exist: range errors come before any run is read.
    sweeps = options.pop("sweeps", [f"l4={tmp_path / 'absent'}"])
    with pytest.raises(ValueError) as caught:
        plan_fleet(*target, sweeps=sweeps, chips=["l4"], **options)
    assert str(caught.value).startswith(named), caught.value


def test_plan_fleet_names_an_unreadable_sweep_and_plans_a_readable_one(tmp_path):
    with pytest.raises(ValueError, match=r"^--sweep l4=.*absent"):
        plan_fleet(10, 300, sweeps=[f"l4={tmp_path / 'absent'}"])
    summary = [
        {"shape": "short", "concurrency": c, "decisions_per_s": x, "p99_ms": p, "prompt_tokens_median": 60}
        for c, x, p in [(1, 10.0, 100.0), (8, 40.0, 400.0)]
    ]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    fleet = plan_fleet(64, 300, sweeps=[f"l4={tmp_path}"], chips=["l4", "v6e"])
    prices, _ = load_prices()
    assert fleet.plans == (plan_chip(read_sweep(tmp_path, chip="l4"), 64, 300, prices),)
    assert fleet.plans[0].chips == 5 and fleet.unmeasured == ("v6e",) and fleet.prompt_tokens == 60


def test_the_gateway_adds_the_pickers_pods_and_their_cost(tmp_path):
    from eval.capacity.plan import load_picker_cost

    picker = load_picker_cost()
    # The chart's request (8 CPU) at n2-standard's $0.0485590 per vCPU-hour: $0.388472/hour for one picker.
    assert (picker.replicas, picker.cpu, picker.memory_gib) == (1, 8, 8)
    assert picker.usd_per_hour == pytest.approx(8 * 0.0485590)
    summary = [
        {"shape": "short", "concurrency": c, "decisions_per_s": x, "p99_ms": p, "prompt_tokens_median": 60}
        for c, x, p in [(1, 10.0, 100.0), (8, 40.0, 400.0)]
    ]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    fleet = plan_fleet(64, 300, sweeps=[f"l4={tmp_path}"], chips=["l4"], gateway=True)
    assert fleet.picker == picker
    assert plan_fleet(64, 300, sweeps=[f"l4={tmp_path}"], chips=["l4"]).picker is None
    (plan,) = fleet.plans
    assert plan.chips == 5  # the same chips as without the gateway (see the CLI test above)
    table = plan_table(
        fleet.plans, rate=64, p99_ms=300, unmeasured=[], jev=fleet.jev, prompt_tokens=60, picker=picker
    )
    ((price, per_hour, _), *_) = plan.costs
    with_picker = per_hour + 8 * 0.0485590
    assert f"| l4 | {price.name} | {with_picker:.2f} | {with_picker / 3600 / 64 * 1e6:.2f} |" in table
    assert "1 endpoint picker pod(s) requesting 8 CPU and 8 GiB each" in table
