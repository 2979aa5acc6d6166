"""Run manifests: what produced a run's evidence, written beside its per-record JSONL."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from readers.engines.base import Engine
from readers.prompt import PROMPT_VERSION

MANIFEST_VERSION = 1


def git_revision() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True).stdout.strip())
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


def run_manifest(kind: str, *, engines: dict[str, Engine], args: dict[str, Any], status: str = "success") -> dict[str, Any]:
    tasks = samples_manifest()["tasks"]
    return {
        "manifest_version": MANIFEST_VERSION,
        "kind": kind,
        "status": status,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_revision(),
        "prompt_version": PROMPT_VERSION,
        "data_sha256": {task: entry["sample_sha256"] for task, entry in tasks.items()},
        "engines": {name: describe_engine(engine) for name, engine in engines.items()},
        "args": args,
    }


def write_json(path: Path, payload: Any) -> None:
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
