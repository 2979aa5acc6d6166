"""``decide deploy``: a run file becomes a plan (the commands and the startup script), printed for a dry
run or carried out with the cloud's own CLI, its output streamed."""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deploy.runfile import PLACEHOLDER_DIGEST, REPACKS, Run
from deploy.startup import render_startup_script
from deploy.targets import create_command, gone_command, preflight_command, watch_command


class DeployError(RuntimeError):
    """A step of a real deploy failed, or the run file is not ready for one."""


@dataclass(frozen=True)
class Step:
    title: str
    argv: list[str]


@dataclass(frozen=True)
class Plan:
    run: Run
    script_path: Path
    script: str
    steps: list[Step]  # run in order by ``execute``
    after: list[Step]  # printed for the user: watch the run, confirm nothing is left


def script_dir() -> Path:
    """Where a deploy writes the startup script it hands to the CLI (the same path every time)."""
    return Path(tempfile.gettempdir()) / "opendecide-deploy"


def plan(run: Run, directory: Path | None = None) -> Plan:
    """The commands and the startup script for ``run``; nothing is run or written."""
    script_path = (directory or script_dir()) / f"{run.name}.startup.sh"
    if run.platform == "aws":
        backstop = (
            f"created with --instance-initiated-shutdown-behavior terminate, it shuts itself down "
            f"after {run.max_run_duration} at the latest"
        )
    elif run.target == "v5e":
        backstop = f"--max-run-duration {run.max_run_duration} deletes its TPU if the script does not"
    else:
        backstop = f"--max-run-duration {run.max_run_duration} with --instance-termination-action DELETE deletes it if the script does not"
    steps = [
        Step(f"the Hugging Face token secret {run.hf_secret!r} exists", preflight_command(run)),
        Step(
            f"create the machine; its startup script ({script_path}) deletes it at the end; backstop: {backstop}",
            create_command(run, str(script_path)),
        ),
    ]
    after = [
        Step("watch it", watch_command(run)),
        Step("confirm it is gone (prints nothing once deleted)", gone_command(run)),
    ]
    return Plan(run=run, script_path=script_path, script=render_startup_script(run), steps=steps, after=after)


def format_command(argv: list[str]) -> str:
    """One shell-quoted command, each ``--flag value`` on its own continued line."""
    lines: list[list[str]] = [[]]
    for word in argv:
        if word.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return " \\\n    ".join(" ".join(line) for line in lines)


def format_plan(p: Plan) -> str:
    """The dry run's text: every command in order, then the rendered startup script."""
    run = p.run
    where = f"{run.project}, {run.zone}" if run.platform == "gcp" else f"AWS {run.aws.region}"
    models = ", ".join(m.served for m in run.models)
    evaluation = f"eval {run.eval.run}" if run.eval else "no eval"
    out = [
        f"# decide deploy: {run.name}, target {run.target} ({run.provisioning}) in {where}",
        f"# models: {models}; {evaluation}; run directory to {run.bucket}/{run.name}/<UTC start time>/",
        f"# engine image {run.engine_image}",
        f"# service image {run.service_image}",
    ]
    if any(m.prepared or m.measure is not None for m in run.models) or run.patches:
        out += [f"# arm {m.tag}: {_arm(run, m)}" for m in run.models]
    if run.patches:
        out.append(f"# the TPU patches plugin from {run.patches}, installed in the engine before vllm serve")
    out.append("")
    for number, step in enumerate(p.steps, 1):
        out += [f"# {number}. {step.title}", format_command(step.argv), ""]
    for step in p.after:
        out += [f"# then, {step.title}:", format_command(step.argv), ""]
    out += [
        f"# --- startup script: {p.script_path} ---",
        p.script.rstrip("\n"),
        "# --- end of startup script ---",
    ]
    return "\n".join(out) + "\n"


def _arm(run: Run, model) -> str:
    """One line per arm: where its weights come from, what it measures, its serving flags."""
    from deploy.startup import measures

    if model.repack is not None:
        source = f"{model.id} repacked on the machine (decide repack {' '.join(REPACKS[model.repack])})"
    elif model.build is not None:
        source = f"the build {model.build} (repacked from {model.id})"
    else:
        source = model.id
    gmu = (
        f", --gpu-memory-utilization {model.gpu_memory_utilization:g}" if model.gpu_memory_utilization else ""
    )
    measured = ", ".join(measures(run, model)) or "nothing (served only)"
    return f"{source}; measures {measured}; --max-model-len {model.max_model_len}{gmu}; results uploaded when it ends"


def execute(
    p: Plan,
    echo: Callable[[str], None] = print,
    runner: Callable[[list[str]], int] = lambda argv: subprocess.run(argv, check=False).returncode,
) -> None:
    """Write the startup script and run each step, its output streamed; raises ``DeployError`` on the
    first failing step (nothing after it runs)."""
    if PLACEHOLDER_DIGEST in p.run.service_image:
        raise DeployError(
            "service_image: still the example's placeholder digest; build and push the service image "
            "(docs/deploy.md) and put its digest in the run file"
        )
    p.script_path.parent.mkdir(parents=True, exist_ok=True)
    p.script_path.write_text(p.script)
    for number, step in enumerate(p.steps, 1):
        echo(f"# {number}. {step.title}\n{format_command(step.argv)}")
        try:
            status = runner(step.argv)
        except FileNotFoundError:
            raise DeployError(f"step {number} ({step.title}): {step.argv[0]} is not installed") from None
        if status != 0:
            raise DeployError(f"step {number} ({step.title}) failed with exit status {status}")
    for step in p.after:
        echo(f"# then, {step.title}:\n{format_command(step.argv)}")
