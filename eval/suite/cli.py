"""``decide eval suite``: the public suite in Nimble's record format, run and scored, or built from the tasks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from eval.options import EngineImageOption, ServiceImageOption
from readers.prompt import PROMPT_VERSION
from service.pipeline.options import EngineUrlOption, PriorCorrectionOption, TopKOption
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION

suite_commands = typer.Typer(help="The public suite in Nimble's record format.", invoke_without_command=True)


@suite_commands.callback()
def eval_suite(
    context: typer.Context,
    data: Annotated[
        Path | None, typer.Option(help="suite directory: <subset>/all.jsonl (+ manifest.json)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="run directory (resumed if it exists)")] = None,
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE]\\[@URL]")] = "local",
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
    from eval.evidence.manifest import Images, RunRefused
    from eval.suite.run import score_suite_with_engine
    from eval.suite.table import suite_table
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


@suite_commands.command("build-from-tasks")
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
    from eval.decisions.tasks import TASKS
    from eval.suite.records import build_from_tasks

    names = tasks.split(",") if tasks else list(TASKS)
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise typer.BadParameter(
            f"unknown task(s) {unknown}; shipped: {', '.join(TASKS)}", param_hint="--tasks"
        )
    for subset, digest in build_from_tasks(out, tasks=names, unsampled=unsampled).items():
        typer.echo(f"{subset}: {digest}")
