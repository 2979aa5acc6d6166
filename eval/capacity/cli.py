"""Capacity commands: ``decide cost``, ``decide survey-study``, ``decide survey``, ``decide plan`` and ``decide eval load``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from eval.options import EngineImageOption, ServiceImageOption
from service.pipeline.options import EngineUrlOption, quiet_loaders

decide_commands = typer.Typer()
eval_commands = typer.Typer()
# decide eval load --concurrency: a tuple, so the default cannot be changed in place.
LOAD_CONCURRENCIES = (1, 4, 8, 16)


@decide_commands.command("cost")
def cost(
    runs: Annotated[
        list[Path] | None, typer.Argument(help="`decide eval load` or `decide eval tasks` run directories")
    ] = None,
    chip: Annotated[
        str, typer.Option(help="the chip the runs were measured on: price rows with this chip apply")
    ] = "cpu",
    quoted: Annotated[
        bool, typer.Option(help="add the reference study's published v6e decisions/s (marked quoted)")
    ] = False,
    price: Annotated[
        list[str], typer.Option(help="NAME=USD_PER_HOUR: a price row for --chip (repeatable)")
    ] = [],  # noqa: B006
    prices: Annotated[
        Path | None, typer.Option(help="a prices TOML replacing the shipped eval/data/prices.toml")
    ] = None,
    utilisation: Annotated[float, typer.Option(help="share of billed time the chip is busy deciding")] = 1.0,
    concurrency: Annotated[
        int, typer.Option(help="the measured concurrency to cost (latency.json holds 1 and 8)")
    ] = 8,
    out: Annotated[Path | None, typer.Option(help="also write cost.json and cost.png here")] = None,
) -> None:
    """Cost per million decisions: $/h ÷ 3600 ÷ (decisions/s × utilisation) × 10⁶, and Jev's at the same prompts."""
    from eval.capacity.cost import (
        break_even_rows,
        break_even_table,
        cost_rows,
        cost_table,
        load_prices,
        price_overrides,
        quoted_v6e_throughputs,
        throughput_of_run,
        write_cost,
    )

    try:
        overrides = price_overrides(price, chip=chip)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--price") from None
    try:
        price_rows, jev = load_prices(prices, overrides)
    except ValueError as exc:  # a row at or below 0 $/h, from --prices or --price
        raise typer.BadParameter(str(exc), param_hint="--price / --prices") from None
    from eval.evidence.storage import TransferRefused

    try:
        throughputs = [
            throughput_of_run(run, label=run.name, chip=chip, concurrency=concurrency) for run in runs or []
        ]
    except (
        ValueError,
        TransferRefused,
    ) as exc:  # no measurement, another chip's run, or a download that does not match its manifest
        raise typer.BadParameter(str(exc), param_hint="RUNS / --chip") from None
    if quoted:
        throughputs += quoted_v6e_throughputs()
    try:
        rows = cost_rows(throughputs, price_rows, jev, utilisation=utilisation)
    except ValueError as exc:  # --utilisation out of (0, 1]
        raise typer.BadParameter(str(exc)) from None
    unmeasured = break_even_rows(rows, price_rows, utilisation=utilisation)
    if out:
        write_cost(out, rows, unmeasured)
    typer.echo(cost_table(rows))
    if unmeasured:
        typer.echo(break_even_table(unmeasured))


@decide_commands.command("survey-study")
def survey_study(
    reserve_gib: Annotated[
        float, typer.Option(help="activation reserve subtracted from usable memory")
    ] = 0.25,
) -> None:
    """The survey's weight formats against the reference study's published v5e figures (12B w8a8-emb4, 26B repack)."""
    from eval.capacity.survey_study import study_check, study_table

    typer.echo(study_table(study_check(reserve_gib=reserve_gib)))


@decide_commands.command("survey")
def survey(
    models: Annotated[list[str], typer.Argument(help="Hugging Face model ids")],
    chip: Annotated[str, typer.Option(help="v5e, v6e, l4, or cpu (vLLM-CPU: needs --kv-cache-gib)")],
    metadata: Annotated[
        Path | None, typer.Option(help="saved metadata JSON (offline); default: fetch from the Hub")
    ] = None,
    max_model_len: Annotated[int, typer.Option(help="tokens per request the server is started with")] = 4096,
    license: Annotated[
        str | None, typer.Option("--license", help="comma-separated licences to keep, e.g. apache-2.0,mit")
    ] = None,
    reserve_gib: Annotated[
        float, typer.Option(help="activation reserve subtracted from usable memory")
    ] = 0.25,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option(help="vLLM's --gpu-memory-utilization (default: 0.92 on TPU, 0.9 on L4)")
    ] = None,
    kv_cache_gib: Annotated[
        float | None, typer.Option(help="a fixed KV pool, as vLLM's --kv-cache-memory-bytes (in GiB)")
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="vLLM's --dtype: auto (the config's), half, float16, bfloat16, float, float32")
    ] = "auto",
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            help="vLLM's --kv-cache-dtype: auto (the weights' dtype, on every chip), bfloat16, fp8 (e5m2 on v6e, e4m3 elsewhere), fp8_e4m3, fp8_e5m2"
        ),
    ] = "auto",
    measured: Annotated[
        list[str],
        typer.Option(
            help="MODEL=PATH: a server start-up log, or a run directory/manifest that recorded one (repeatable)"
        ),
    ] = [],  # noqa: B006
    weight_format: Annotated[
        str | None,
        typer.Option(
            help="size the weights as a quantized build stores them: bf16, fp8, w8a8, w8a8-emb4, w4a16, w4a16-emb8 (docs/quantization.md)"
        ),
    ] = None,
    sliding_kv: Annotated[
        str,
        typer.Option(
            help="window: a sliding layer keeps its window of KV; full: the whole length (tpu-inference, Gemma 4)"
        ),
    ] = "window",
) -> None:
    """Which models fit a chip: weights, KV bytes per token, KV tokens and concurrency, verdict; predicted vs measured."""
    from eval.capacity.survey import measured_table, survey_models, survey_table

    licences = {name.strip() for name in license.split(",")} if license else None
    try:
        rows, skipped = survey_models(
            models, chip=chip, metadata=metadata, licences=licences, measured=measured, max_model_len=max_model_len,
            reserve_gib=reserve_gib, kv_cache_gib=kv_cache_gib, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
            memory_utilisation=gpu_memory_utilization, weight_format=weight_format, sliding_kv=sliding_kv,
        )  # fmt: skip
    except ValueError as exc:  # an option out of range, a bad --measured, a model --metadata lacks
        raise typer.BadParameter(str(exc)) from None
    typer.echo(survey_table(rows))
    if comparison := measured_table(rows):
        typer.echo("Predicted vs measured:\n\n" + comparison)
    if skipped:
        typer.echo("left out by --license: " + ", ".join(skipped))


@decide_commands.command("plan")
def plan(
    rate: Annotated[float, typer.Option(help="decisions/s the fleet must carry")],
    p99: Annotated[float, typer.Option(help="p99 latency target in ms")],
    sweep: Annotated[
        list[str], typer.Option(help="CHIP=RUN: a `decide eval load` run measured on that chip (repeatable)")
    ] = [],  # noqa: B006
    chips: Annotated[str, typer.Option(help="comma-separated chips to plan for")] = "v6e,v5e,l4",
    prices: Annotated[
        Path | None, typer.Option(help="a prices TOML replacing the shipped eval/data/prices.toml")
    ] = None,
    max_utilisation: Annotated[
        float, typer.Option(help="keep each chip under this share of its measured peak decisions/s")
    ] = 0.8,
    gateway: Annotated[
        bool,
        typer.Option(help="the fleet behind GKE Inference Gateway: add the endpoint picker's pods and cost"),
    ] = False,
) -> None:
    """Chips and service replicas for --rate decisions/s within --p99, per chip, with $/hour, $/million and Jev's cost."""
    from eval.capacity.plan import plan_fleet, plan_table

    try:
        fleet = plan_fleet(
            rate, p99, sweeps=sweep, chips=chips.split(","), prices=prices, max_utilisation=max_utilisation,
            gateway=gateway,
        )  # fmt: skip
    except ValueError as error:  # an option out of range, a --sweep that is not CHIP=RUN or not readable
        raise typer.BadParameter(str(error)) from None
    typer.echo(
        plan_table(
            fleet.plans,
            rate=rate,
            p99_ms=p99,
            unmeasured=fleet.unmeasured,
            jev=fleet.jev,
            prompt_tokens=fleet.prompt_tokens,
            picker=fleet.picker,
        )
    )


@eval_commands.command("load")
def eval_load(
    out: Annotated[
        Path, typer.Option(help="directory for load.jsonl, load.md, load.png, summary.json, manifest.json")
    ],
    engine: Annotated[
        str, typer.Option("--engine", help="KIND[:MODE]\\[@URL]: the engine behind the service")
    ] = "local",
    engine_url: EngineUrlOption = None,
    url: Annotated[
        str | None, typer.Option(help="a running service to load instead of an in-process one")
    ] = None,
    concurrency: Annotated[
        list[int], typer.Option(help="concurrencies for short states (repeatable)")
    ] = LOAD_CONCURRENCIES,
    passes: Annotated[int, typer.Option(help="passes per concurrency")] = 3,
    requests: Annotated[int, typer.Option(help="requests per short-state pass")] = 48,
    long_requests: Annotated[
        int, typer.Option(help="requests per long-state pass (~1,024 and ~3,072 tokens)")
    ] = 16,
    engine_image: EngineImageOption = None,
    service_image: ServiceImageOption = None,
) -> None:
    """Decisions/s and latency percentiles through the service by concurrency, plus long unique states."""
    quiet_loaders()
    from eval.capacity.sweep import load_sweep, sweep_table
    from eval.evidence.manifest import Images
    from service.app import create_app  # the load run measures the HTTP service itself (tests/test_layers.py)

    summary = asyncio.run(
        load_sweep(
            engine, out, engine_url=engine_url, url=url, service_app=create_app, concurrencies=tuple(concurrency), passes=passes,
            requests=requests, long_requests=long_requests, images=Images(engine_image, service_image),
        )
    )  # fmt: skip
    typer.echo(sweep_table(summary))
