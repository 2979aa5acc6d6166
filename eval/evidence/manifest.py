"""Run manifests: what produced a run's evidence (eval runs and benchmarks alike), written beside it.

A manifest names the run (``run``: tasks, suite, agree, load, or ``bench:<name>``), its status, the
git commit, prompt version, data sha256, each engine (kind, model, revision, read mode, probe), the
serving images (``images: {engine, service}``, references as given, or null) and the arguments.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import subprocess
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from readers.engines.base import Engine
from readers.prompt import PROMPT_VERSION

MANIFEST_VERSION = 1
MANIFEST = "manifest.json"


class RunRefused(RuntimeError):
    """The directory holds results this run must not mix with."""


@dataclass(frozen=True)
class Images:
    """The serving images a run went through (``--engine-image``, ``--service-image``), as given."""

    engine: str | None = None
    service: str | None = None


def images_of(manifest: dict[str, Any]) -> Images:
    """The images a manifest records; manifests before ``images`` kept one ``image_digest``
    (the image serving the engine)."""
    if "images" in manifest:
        return Images(**manifest["images"])
    return Images(engine=manifest.get("image_digest"))


@functools.cache
def git_revision() -> dict[str, Any]:
    """The commit this process's code came from, and whether the tree differed from it. Asked once per
    process: the code a process runs is what it imported, whatever the tree becomes afterwards."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": sha, "dirty": dirty}


def describe_engine(engine: Engine) -> dict[str, Any]:
    """Model, revision, engine kind, read mode and the probe's raw evidence."""
    return {
        "kind": engine.kind,
        "model": engine.info.name,
        "revision": engine.info.revision,
        "context_length": engine.info.context_length,
        "read_mode": engine.capabilities.read_mode.value,
        "max_logprobs": engine.capabilities.max_logprobs,
        "top_k": engine.capabilities.top_k,
        "probe": engine.capabilities.probe,
    }


def samples_manifest() -> dict[str, Any]:
    return json.loads(resources.files("eval.data").joinpath("MANIFEST.json").read_text(encoding="utf-8"))


def run_manifest(
    run: str,
    *,
    engines: dict[str, Engine],
    args: dict[str, Any],
    images: Images | None = None,
    status: str = "success",
    prompt_version: str = PROMPT_VERSION,
) -> dict[str, Any]:
    """The manifest of ``run`` read through ``engines`` (name → open engine) with ``args``, under
    the layout ``prompt_version`` (the current one unless a run compares layouts)."""
    tasks = samples_manifest()["tasks"]
    return {
        "manifest_version": MANIFEST_VERSION,
        "run": run,
        "status": status,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": dict(git_revision()),  # a copy: the cached answer stays as git gave it
        "prompt_version": prompt_version,
        "data_sha256": {task: entry["sample_sha256"] for task, entry in tasks.items()},
        "dev_data_sha256": {task: entry["dev_sha256"] for task, entry in tasks.items()},
        "fresh_data_sha256": {task: entry["fresh_sha256"] for task, entry in tasks.items()},
        "engines": {name: describe_engine(engine) for name, engine in engines.items()},
        "images": asdict(images or Images()),
        "args": args,
    }


def write_json(path: Path, payload: Any) -> None:
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


SPLIT_CHECKSUMS = {"test": "data_sha256", "dev": "dev_data_sha256", "fresh": "fresh_data_sha256"}
"""The manifest key holding the sha256 of each split's sample files."""


def _read_data(manifest: dict) -> dict[str, str | None]:
    """The checksums of the samples a run reads: its split's, for its tasks' samples."""
    from eval.decisions.tasks import TASKS

    args = manifest["args"]
    split = args.get("split", "test")
    # Manifests written before the fresh split existed name no checksums of it.
    checksums = manifest.get(SPLIT_CHECKSUMS[split], {})
    samples = {TASKS[task].sample_name if task in TASKS else task for task in args.get("tasks") or checksums}
    return {sample: checksums.get(sample) for sample in sorted(samples)} | {"split": split}


def check_directory(out: Path, manifest: dict) -> None:
    """Refuse to mix: same model, revision, read mode, data and prompt, or a fresh directory."""
    existing_path = out / MANIFEST
    if not existing_path.is_file():
        return
    existing = json.loads(existing_path.read_text())
    mine, theirs = manifest["engines"]["run"], existing["engines"]["run"]
    for field, a, b in [
        ("model", mine["model"], theirs["model"]),
        ("revision", mine["revision"], theirs["revision"]),
        ("read mode", mine["read_mode"], theirs["read_mode"]),
        ("top-k", mine["top_k"], theirs["top_k"]),
        ("prompt version", manifest["prompt_version"], existing["prompt_version"]),
        # The samples the run reads (a sample added later does not make an old run another one's).
        ("data", _read_data(manifest), _read_data(existing)),
        ("tasks", manifest["args"].get("tasks"), existing["args"].get("tasks")),
        ("limit", manifest["args"].get("limit"), existing["args"].get("limit")),
        # Runs from before the option answered raw.
        (
            "prior correction",
            manifest["args"].get("prior_correction", "off"),
            existing["args"].get("prior_correction", "off"),
        ),
    ]:
        if a != b:
            raise RunRefused(f"{out} holds results with {field} {b!r}, not {a!r}: use another --out")
