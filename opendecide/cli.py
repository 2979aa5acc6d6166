"""``decide``: one command line, mounted from each layer's own commands.

Each layer owns its commands (``service/cli.py``: serve, ask; ``eval/cli.py``: eval, cost, survey-study, survey, plan;
``deploy/cli.py``: engine, deploy; ``deploy/repack_cli.py``: repack). This module only puts them under one name, so ``decide --help``
imports typer and the four command modules, never a model library.
"""

from __future__ import annotations

import signal
import sys

if sys.argv[1:2] == ["serve"] and hasattr(signal, "SIGHUP"):
    # SIGHUP's default action ends the process, and the imports below take about a second: ignored
    # until the service takes the signal over (service.keys.hold_sighup), so an operator's reload
    # sent while it starts never kills it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

import typer

from deploy.cli import app as deploy_commands
from deploy.repack_cli import app as repack_commands
from eval.cli import app as eval_commands
from opendecide.extras import MissingExtra
from service.cli import app as service_commands

app = typer.Typer(
    help="Typed decisions with probabilities from open models, in Jev's, OpenAI's and Google's wire formats.",
    no_args_is_help=True,
)
for commands in (service_commands, eval_commands, deploy_commands, repack_commands):
    app.add_typer(commands)


def main() -> None:
    """The ``decide`` entry point: ``app``, with a missing extra said in one line (which extra installs
    it), not a traceback, whichever command needed it."""
    try:
        app(prog_name="decide")
    except MissingExtra as error:
        typer.echo(f"Error: {error}", err=True)
        raise SystemExit(1) from None
