"""Command-line options that more than one eval command module declares: the container images a run records."""

from __future__ import annotations

from typing import Annotated

import typer

EngineImageOption = Annotated[
    str | None, typer.Option(help="the engine's container image (repo@sha256:…), recorded in the manifest")
]
ServiceImageOption = Annotated[
    str | None,
    typer.Option(help="the decision service's container image (repo@sha256:…), recorded in the manifest"),
]
