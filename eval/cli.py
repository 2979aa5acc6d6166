"""Evaluation commands: ``decide eval …``, ``decide cost``, ``decide survey``, ``decide plan``.

Each eval package owns its commands (``decisions/cli.py``, ``decisions/studies_cli.py``, ``capacity/cli.py``,
``evidence/cli.py``, ``generation/cli.py``, ``suite/cli.py``); this module only mounts them, in the order
``decide --help`` and ``decide eval --help`` list them.
"""

from __future__ import annotations

import typer
from typer.models import CommandInfo

from eval.capacity import cli as capacity
from eval.decisions import cli as decisions
from eval.decisions import studies_cli as studies
from eval.evidence import cli as evidence
from eval.generation import cli as generation
from eval.suite.cli import suite_commands

# Typer lists a group's commands in the order they were registered, so the help pages keep this order
# whichever package a command lives in.
DECIDE_ORDER = ("cost", "survey-study", "survey", "plan")
EVAL_ORDER = (
    "agree", "tasks", "load", "score", "compare", "gold-curve", "label-styles", "calibration-modes", "read-modes",
    "upload", "download", "debias", "pack", "prior-figures", "dev-reads", "many-options", "regression", "few-shot",
    "generate", "throughput", "quoted", "generation-table",
)  # fmt: skip


def mount(target: typer.Typer, order: tuple[str, ...], *sources: typer.Typer) -> None:
    """Register every command of ``sources`` on ``target`` in ``order``; a command left out of ``order``
    (or named twice) is a mistake in this module, so it fails at import rather than vanishing from the help."""
    commands: dict[str | None, CommandInfo] = {}
    for source in sources:
        for info in source.registered_commands:
            if info.name in commands:
                raise RuntimeError(f"two eval commands named {info.name!r}")
            commands[info.name] = info
    if set(commands) != set(order):
        raise RuntimeError(f"eval commands {sorted(map(str, commands))} vs the listed order {sorted(order)}")
    target.registered_commands.extend(commands[name] for name in order)


app = typer.Typer()
mount(app, DECIDE_ORDER, capacity.decide_commands)
eval_app = typer.Typer(help="Evaluate: agreement between engines, tasks, the public suite, comparisons.")
app.add_typer(eval_app, name="eval")
mount(
    eval_app,
    EVAL_ORDER,
    decisions.eval_commands,
    studies.eval_commands,
    capacity.eval_commands,
    evidence.eval_commands,
    generation.eval_commands,
)
eval_app.add_typer(suite_commands, name="suite")
