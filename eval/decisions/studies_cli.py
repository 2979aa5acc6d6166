"""``decide eval label-styles|calibration-modes|read-modes|debias|prior-figures|dev-reads|many-options|regression|few-shot``:
the read-policy and calibration studies on the shipped tasks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from readers.prompt import PROMPT_VERSION
from service.pipeline.options import (
    EngineUrlOption,
    ModelOption,
    PriorCorrectionOption,
    TopKOption,
    quiet_loaders,
)
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION

eval_commands = typer.Typer()


@eval_commands.command("label-styles")
def eval_label_styles(
    out: Annotated[
        Path,
        typer.Option(
            help="directory: one run per prompt version and style set (resumed if present) + label-styles.json"
        ),
    ],
    engine: Annotated[
        str, typer.Option("--engine", help="KIND[:MODE]\\[@URL], e.g. local, vllm@http://127.0.0.1:8100")
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
    from eval.decisions.label_styles import evaluate_label_styles, label_styles_table

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


@eval_commands.command("calibration-modes")
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
        typer.Option("--engine", help="engine for the content-free reads of the prior (KIND[:MODE]\\[@URL])"),
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
    from eval.decisions.calibration_modes import calibration_modes, modes_table

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


@eval_commands.command("read-modes")
def eval_read_modes(
    runs: Annotated[
        list[Path], typer.Argument(help="directories written by `decide eval agree --out` (a = exact reads)")
    ],
    out: Annotated[Path | None, typer.Option(help="also write the rows as JSON here")] = None,
) -> None:
    """Tabulate what each read mode costs against exact reads, from agreement evidence only."""
    from eval.decisions.read_modes import read_modes_table, write_read_modes

    typer.echo(read_modes_table(write_read_modes(runs, out)))


@eval_commands.command("debias")
def eval_debias(
    out: Annotated[
        Path,
        typer.Option(
            help="run directory: one sub-directory of records per setting, debias.json and debias.md"
        ),
    ],
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE]\\[@URL], e.g. local")] = "local",
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
    from eval.decisions.debias import debias_table, evaluate_debias

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


@eval_commands.command("prior-figures")
def eval_prior_figures(
    run: Annotated[Path, typer.Argument(help="a run read with the default prior correction")],
    before: Annotated[Path, typer.Option(help="a run of the same reads answered raw")],
) -> None:
    """The prior-correction figures docs/prompts-and-labels.md quotes: label mass, Sci/Tech ranks, answer counts, majority rates, raw-read agreement."""
    from eval.decisions.prior_figures import prior_figures

    typer.echo("\n".join(prior_figures(run, before)))


@eval_commands.command("dev-reads")
def eval_dev_reads(
    out: Annotated[Path, typer.Option(help="run directory: one resumable dev run per layout, report beside")],
    prompt_versions: Annotated[
        str, typer.Option(help="comma-separated layouts of the registry to compare (default: every one)")
    ] = "",
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks (default: every one)")] = "",
    limit: Annotated[int | None, typer.Option(help="dev records per task (default: all 200)")] = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE]\\[@URL], e.g. local")] = "local",
    engine_url: EngineUrlOption = None,
    model: ModelOption = None,
) -> None:
    """Layouts × prior correction per question type on the dev split, and the read the rule picks (eval/decisions/dev_reads.py)."""
    quiet_loaders()
    from eval.decisions.dev_reads import dev_reads_table, evaluate_dev_reads
    from eval.decisions.tasks import TASKS
    from eval.evidence.manifest import write_json
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


@eval_commands.command("many-options")
def eval_many_options(
    out: Annotated[Path, typer.Option(help="run directory: rows.jsonl (resumable per cell), report beside")],
    limit: Annotated[int | None, typer.Option(help="dev records per task (default: all 200)")] = None,
    concurrency: Annotated[int, typer.Option(help="reads in flight")] = 4,
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE]\\[@URL], e.g. local")] = "local",
) -> None:
    """decide-prompt/7 against options-first /8 on many-option dev questions, and the option count the
    rule picks (eval/decisions/many_options.py)."""
    quiet_loaders()
    from eval.decisions.many_options import evaluate_many_options, many_options_table

    report = asyncio.run(evaluate_many_options(engine, out, limit=limit, concurrency=concurrency))
    typer.echo(many_options_table(report))


@eval_commands.command("regression")
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
    engine: Annotated[str, typer.Option("--engine", help="KIND[:MODE]\\[@URL], e.g. local")] = "local",
    engine_url: EngineUrlOption = None,
    model: ModelOption = None,
) -> None:
    """Two read policies on the shipped test samples, paired per task and question type (eval/decisions/regression.py)."""
    quiet_loaders()
    from eval.decisions.regression import ReadPolicy, evaluate_regression, regression_table
    from eval.decisions.tasks import TASKS
    from eval.evidence.manifest import write_json

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


@eval_commands.command("few-shot")
def eval_few_shot(
    out: Annotated[
        Path,
        typer.Option(
            help="directory for dev-curve.{json,md}, few-shot.png, test-confirm.{json,md} (round 5: also fresh-confirm.{json,md})"
        ),
    ] = Path("evidence/few-shot"),
    confirm: Annotated[
        bool,
        typer.Option(
            "--confirm/--no-confirm",
            help="also score the rule's choice on the committed test reads, and from round 5 the fresh reads (reported once: rerun only to regenerate it)",
        ),
    ] = True,
    seed: Annotated[int, typer.Option(help="split, bootstrap and ECE-floor seed")] = 0,
    round_: Annotated[
        int,
        typer.Option(
            "--round",
            help="the rule's round: 1 (evidence/few-shot/rule.md), 2 (evidence/few-shot/round-2/rule.md: more modes, the pass check), 3 (evidence/few-shot/round-3/rule.md: the probe; reads the records again on the embedded engine), 4 (evidence/few-shot/round-4/rule.md: the probe averaged over bootstrap fits, ECE pooled over splits) or 5 (evidence/few-shot/round-5/rule.md: a type's ECE the mean of its tasks', confirmed on the fresh split as well)",
        ),
    ] = 1,
) -> None:
    """Accuracy, macro-F1 and ECE after N gold answers per mode, the default the committed rule picks
    on the dev rows, and its confirmation on the test rows and from round 5 the fresh rows
    (eval/decisions/few_shot.py; rows only, no reads but the hidden states rounds 3-5 need)."""
    from eval.decisions.few_shot import (
        FRESH_RUN,
        ROUNDS,
        TEST_RUN,
        confirm_table,
        curve_table,
        done_table,
        run_few_shot,
    )

    if round_ not in ROUNDS:
        raise typer.BadParameter(f"--round is one of {', '.join(map(str, ROUNDS))}, not {round_}")
    # The committed rows, candidates and rule only: each round's test table is what it reported,
    # regenerated, never another confirmation of another candidate set (its rule.md).
    result = run_few_shot(
        out,
        test_run=Path(TEST_RUN) if confirm else None,
        fresh_run=Path(FRESH_RUN) if confirm and ROUNDS[round_].get("fresh") else None,
        seed=seed,
        round_=round_,
    )
    typer.echo(curve_table(result["dev"]), nl=False)
    for name in ("fresh", "test", "fresh without features", "test without features"):
        if name in result:
            typer.echo(confirm_table(result[name]), nl=False)
    if "done_when" in result:
        typer.echo(done_table(result["done_when"]), nl=False)
