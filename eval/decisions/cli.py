"""``decide eval agree|tasks|score|compare|gold-curve``: read the shipped tasks, and score and compare runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from eval.options import EngineImageOption, ServiceImageOption
from service.pipeline.options import (
    ChatTemplateOption,
    EngineUrlOption,
    ModelOption,
    PriorCorrectionOption,
    TopKOption,
    quiet_loaders,
)
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION

eval_commands = typer.Typer()


@eval_commands.command("agree")
def eval_agree(
    a: Annotated[
        str, typer.Option("--a", help="engine KIND[:MODE]\\[@URL], e.g. local or local:topk")
    ] = "local",
    b: Annotated[
        str, typer.Option("--b", help="engine KIND[:MODE]\\[@URL], e.g. vllm:masked@http://127.0.0.1:8100")
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
    from eval.decisions.agree import agreement_table, run_agreement
    from eval.evidence.manifest import Images, RunRefused

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


@eval_commands.command("tasks")
def eval_tasks(
    out: Annotated[
        Path, typer.Option(help="run directory: records.jsonl.gz + manifest.json (resumed if it exists)")
    ],
    engine: Annotated[
        str, typer.Option("--engine", help="KIND[:MODE]\\[@URL], e.g. local, vllm@http://127.0.0.1:8100")
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
        str,
        typer.Option(
            help="test (the shipped samples evals report), dev (what defaults are chosen on) or fresh (read once, to confirm a rule written first)"
        ),
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

    from eval.decisions.runner import evaluate_tasks
    from eval.decisions.tasks import SPLITS, TASKS
    from eval.evidence.manifest import Images

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


@eval_commands.command("score")
def eval_score(
    run: Annotated[Path, typer.Argument(help="a run directory written by `decide eval tasks`")],
    seed: Annotated[int, typer.Option(help="seed of the gold-answer splits")] = 0,
) -> None:
    """Per-task scores from the run's evidence only: score.json, score.md and figures beside it."""
    from eval.decisions.score import score_table, write_score

    typer.echo(score_table(write_score(run, seed=seed)))


@eval_commands.command("compare")
def eval_compare(
    run_a: Annotated[Path, typer.Argument(help="run directory A")],
    run_b: Annotated[Path, typer.Argument(help="run directory B")],
    allow_different_image: Annotated[
        bool, typer.Option(help="compare runs over different data or serving images (engine or service)")
    ] = False,
) -> None:
    """Paired comparison of two runs: same gold answers, accuracy difference (bootstrap CI), McNemar.
    Two `decide eval generate` runs: RUN_A is the reference, paired by problem."""
    from eval.decisions.compare import ComparisonRefused, compare_runs, compare_table
    from eval.generation.compare import compare_generation, compare_generation_table, is_generation_run

    try:
        if is_generation_run(run_a) or is_generation_run(run_b):
            typer.echo(compare_generation_table(compare_generation(run_a, run_b)))
            return
        report = compare_runs(run_a, run_b, allow_different_image=allow_different_image)
    except ComparisonRefused as error:
        typer.echo(f"refused: {error}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(compare_table(report))


@eval_commands.command("gold-curve")
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
    from eval.decisions.gold_curve import gold_curve_table, run_gold_curve

    typer.echo(gold_curve_table(run_gold_curve(records, out, splits=splits, seed=seed)))
