"""``decide eval upload|download|pack``: run directories to and from Cloud Storage, and old runs to the compressed format."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

eval_commands = typer.Typer()


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
    from eval.evidence.storage import TransferRefused
    from opendecide.extras import needs_extra

    with needs_extra("gcs", "Cloud Storage transfers"):
        from google.api_core.exceptions import GoogleAPICallError

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


@eval_commands.command("upload")
def eval_upload(
    run: Annotated[
        Path, typer.Argument(help="a run directory (records, manifest.json, …)", exists=True, file_okay=False)
    ],
    url: Annotated[str, typer.Argument(help="gs://BUCKET/PREFIX")],
    endpoint: EndpointOption = None,
    project: ProjectOption = None,
) -> None:
    """Upload a run to Cloud Storage; objects already there with the same CRC32C are skipped, manifest.json goes last."""
    from eval.evidence.storage import storage_client, upload_run

    with storage_errors():
        done = upload_run(run, url, client=storage_client(endpoint, project))
    state = "manifest.json written last" if done.manifest_written else "nothing changed, manifest.json kept"
    typer.echo(f"{url}: {len(done.sent)} files sent, {len(done.skipped)} already there; {state}")


@eval_commands.command("download")
def eval_download(
    url: Annotated[str, typer.Argument(help="gs://BUCKET/PREFIX written by `decide eval upload`")],
    dest: Annotated[
        Path, typer.Argument(help="directory to download into (created; files already matching are kept)")
    ],
    endpoint: EndpointOption = None,
    project: ProjectOption = None,
) -> None:
    """Download a run from Cloud Storage, verifying every file against the manifest's sha256."""
    from eval.evidence.storage import download_run, storage_client

    with storage_errors():
        done = download_run(url, dest, client=storage_client(endpoint, project))
    total = len(done.sent) + len(done.skipped)
    typer.echo(
        f"{dest}: {len(done.sent)} files fetched, {len(done.skipped)} already there, all {total} match the manifest's sha256"
    )


@eval_commands.command("pack")
def eval_pack(
    directories: Annotated[
        list[Path], typer.Argument(help="folders searched for plain records.jsonl, a.jsonl and b.jsonl")
    ],
) -> None:
    """Convert run folders made before the compressed format: rows to <name>.jsonl.gz, decision ids and
    timings to <name>.timings.jsonl.gz, manifests' reads renamed; each plain file removed once read back."""
    from eval.evidence.rows import pack_plain

    for directory in directories:
        for written in pack_plain(directory):
            typer.echo(written)
