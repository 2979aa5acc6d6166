"""Render a run's startup script: ``deploy/startup.sh`` with its settings block filled from the run file.

Only the block between the settings markers changes, so the rendered script is the template that
``shellcheck`` checks, plus shell-quoted values. The vLLM and service flag lists are built here, once.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources

from deploy.runfile import REPACKS, Model, Run
from deploy.targets import self_delete_command

TEMPLATE = resources.files("deploy").joinpath("startup.sh")
SETTINGS_START = (
    "# --- settings (rendered by deploy/startup.py; these example values keep the template checkable) ---"
)
SETTINGS_END = "# --- end settings ---"
RENDERED_START = "# --- settings (rendered by deploy/startup.py from the run file) ---"
ENGINE_URL = "http://127.0.0.1:8000"
SERVICE_PORT = 8080

# How each accelerator's engine container runs: TPU devices need --privileged; the TPU image's
# entrypoint is a shell, the vllm-openai image's is `vllm serve`.
ENGINE_DOCKER_FLAGS = {"tpu": ("--privileged", "--shm-size", "16gb"), "gpu": ("--gpus", "all", "--ipc=host")}
ENGINE_COMMAND = {"tpu": ("vllm", "serve"), "gpu": ()}
# With ``patches``: the plugin's wheel (copied to /wheels) installed in the engine container before
# `vllm serve` starts; it has no dependencies and needs no index (patches/README.md).
PATCHED_ENGINE_COMMAND = (
    "bash",
    "-c",
    "pip install --quiet --no-deps --no-index --root-user-action=ignore /wheels/opendecide_tpu_patches-*.whl"
    ' && exec vllm serve "$@"',
    "vllm-serve",
)


def serve_flags(run: Run, model: Model) -> list[str]:
    """vLLM's flags for one model (after the model id, host and port)."""
    flags = [
        "--max-model-len",
        str(model.max_model_len),
        "--max-num-seqs",
        str(run.max_num_seqs),
        "--max-logprobs",
        str(run.max_logprobs),
        "--generation-config",
        "vllm",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    # A modality read as text only is limited to 0 (no encoder memory reserved); images read in
    # decisions to the run file's count (readers/engines/vllm.py), in the order the run files list them.
    limits = {m: 0 for m in model.modalities}
    if model.images:
        limits = {"image": model.images, **{m: 0 for m in model.modalities if m != "image"}}
    if limits:
        flags += ["--limit-mm-per-prompt", json.dumps(limits, separators=(",", ":"))]
    if model.images:  # the image reads' pass-through chat template is sent with each request
        flags += ["--trust-request-chat-template"]
    if run.generate is not None and run.generate.tool_call_parser is not None:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", run.generate.tool_call_parser]
    if model.gpu_memory_utilization is not None:
        flags += ["--gpu-memory-utilization", f"{model.gpu_memory_utilization:g}"]
    return flags + list(run.engine_flags) + list(model.extra_flags)


def preparation(model: Model) -> str:
    """How an arm's build reaches the machine: ``repack FORMAT ARGS``, ``pull URL``, or nothing."""
    if model.repack is not None:
        return "repack " + " ".join(REPACKS[model.repack])
    return f"pull {model.build}" if model.build is not None else ""


def measures(run: Run, model: Model) -> list[str]:
    """What the arm measures: its ``measure`` list, else what the run file configures."""
    if model.measure is not None:
        return list(model.measure)
    return (["read"] if run.eval else []) + (["generation"] if run.generate else [])


def generate_args(run: Run) -> list[str]:
    """``decide eval generate`` flags shared by every task (the script adds task, URL, out, images)."""
    if run.generate is None:
        return []
    args = ["--max-tokens", str(run.generate.max_tokens)]
    return args + (["--limit", str(run.generate.limit)] if run.generate.limit is not None else [])


def service_flags(run: Run) -> list[str]:
    """``decide serve`` flags shared by every model (the script adds --tokenizer and both image refs)."""
    return [
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVICE_PORT),
        "--engine",
        "vllm",
        "--engine-url",
        ENGINE_URL,
        *run.service_flags,
    ]


def settings(run: Run) -> dict[str, str | list[str]]:
    """The settings block's variables, in order (a list renders as a bash array)."""
    values: dict[str, str | list[str]] = {
        "RUN_NAME": run.name,
        "PLATFORM": run.platform,
        "ACCELERATOR": run.accelerator,
        "AWS_REGION": run.aws.region if run.aws else "",
        "BUCKET": run.bucket,
        "HF_SECRET": run.hf_secret,
        "MAX_RUN_SECONDS": str(run.max_run_seconds),
        "ENGINE_IMAGE": run.engine_image,
        "SERVICE_IMAGE": run.service_image,
        "ENGINE_DOCKER_FLAGS": list(ENGINE_DOCKER_FLAGS[run.accelerator]),
        "ENGINE_COMMAND": list(PATCHED_ENGINE_COMMAND if run.patches else ENGINE_COMMAND[run.accelerator]),
        "MODELS": [m.served for m in run.models],
        "MODEL_TAGS": [m.tag for m in run.models],
        "MODEL_SOURCES": [m.id for m in run.models],
        "MODEL_LOAD": [f"/builds/{m.tag}" if m.prepared else m.id for m in run.models],
        "MODEL_PREP": [preparation(m) for m in run.models],
        "MODEL_MEASURE": [" ".join(measures(run, m)) for m in run.models],
        "PATCHES": run.patches or "",
    }
    for index, model in enumerate(run.models):
        values[f"SERVE_FLAGS_{index}"] = serve_flags(run, model)
    values |= {
        "SERVICE_FLAGS": service_flags(run),
        "EVAL_RUN": run.eval.run if run.eval else "",
        "EVAL_DATA": (run.eval.data or "") if run.eval else "",
        "EVAL_ARGS": list(run.eval.args) if run.eval else [],
        "GEN_TASKS": list(run.generate.gen) if run.generate else [],
        "GEN_ARGS": generate_args(run),
        "GEN_THROUGHPUT": "1" if run.generate and run.generate.throughput else "",
        "SELF_DELETE": self_delete_command(run),
    }
    return values


def render_startup_script(run: Run) -> str:
    """The startup script for ``run``."""
    template = TEMPLATE.read_text()
    head, rest = template.split(SETTINGS_START + "\n", 1)
    _, tail = rest.split(SETTINGS_END + "\n", 1)
    lines = [RENDERED_START]
    for name, value in settings(run).items():
        if name.startswith("SERVE_FLAGS_"):
            lines.append("# shellcheck disable=SC2034  # read through a nameref in serve_model")
        if isinstance(value, list):
            lines.append(f"{name}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            lines.append(f"{name}={shlex.quote(value)}")
    lines.append(SETTINGS_END)
    return head + "\n".join(lines) + "\n" + tail
