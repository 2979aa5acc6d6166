"""``decide eval generate|throughput|quoted|generation-table``: generation runs, server throughput, the study's tables."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from eval.options import EngineImageOption, ServiceImageOption

eval_commands = typer.Typer()


@eval_commands.command("generate")
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

    from eval.evidence.manifest import Images, RunRefused
    from eval.generation.datasets import DataMismatch
    from eval.generation.run import GENERATION_TASKS, ServerRefused, evaluate_generation, summary_table

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


@eval_commands.command("throughput")
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

    from eval.evidence.manifest import Images, RunRefused
    from eval.generation.throughput import PROMPT_TOKENS, run_throughput, throughput_table

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


@eval_commands.command("quoted")
def eval_quoted(
    family: Annotated[
        str,
        typer.Argument(
            help="sweep (v6e-1 decision reads), generation (GSM8K/BFCL), quantization (QAT builds) or all"
        ),
    ] = "all",
) -> None:
    """The study's published tables, every row labelled quoted with its source and date."""
    from eval.generation.quoted_study import generation_table, quantization_table
    from eval.generation.quoted_sweep import quoted_table

    tables = {"sweep": quoted_table, "generation": generation_table, "quantization": quantization_table}
    if family != "all" and family not in tables:
        typer.echo(f"family: expected one of {', '.join([*tables, 'all'])}, got {family!r}", err=True)
        raise typer.Exit(code=2)
    chosen = tables.values() if family == "all" else [tables[family]]
    typer.echo("\n".join(render() for render in chosen), nl=False)


@eval_commands.command("generation-table")
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

    from eval.decisions.compare import ComparisonRefused
    from eval.evidence.manifest import write_json
    from eval.generation.compare import plot_sweep_rows, sweep_markdown, sweep_rows

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
        from eval.generation.quoted_study import generation_table
        from eval.generation.quoted_sweep import quoted_table

        table += "\n" + quoted_table() + "\n" + generation_table()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.md").write_text(table)
        write_json(out / "sweep.json", rows)
        plot_sweep_rows(rows, out / "sweep.png")
    typer.echo(table, nl=False)
