"""``decide serve --engine vllm`` from process start to ``/readyz`` 200, against a stand-in vLLM.

The stand-in (``tests/integration/standin_vllm.py``, run by this python) answers ``/v1/models`` with the
embedded model's prepared folder as its root and ``/v1/completions`` with made-up log-probs: no model
runs, so what is timed is the service's own start-up (imports, tokenizer, the engine's capability probe,
the first readiness read). ``--decide`` is the ``decide`` of the venv to measure, e.g. one with only
``pip install opendecide`` (no torch). Prints each run and the medians: wall ms to ready, and the
service's CPU ms by then (on a busy machine the wall time mostly measures the others).

    python3 -m venv /tmp/base && /tmp/base/bin/pip install .
    .venv/bin/python -m bench.serve_startup --decide /tmp/base/bin/decide --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench import ROOT
from deploy.processes import free_port, wait_for_models
from readers.embedded import prepare_embedded_model


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) the process has used so far, in ms (Linux: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def ready_ms(decide: str, engine_url: str) -> tuple[float, float]:
    """One service start: ms from Popen to the first 200 of ``/readyz`` (polled every 10 ms), and the CPU
    ms the service used by then (wall time depends on what else the machine runs; CPU time much less)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    started = time.monotonic()
    service = subprocess.Popen(
        [decide, "serve", "--engine", "vllm", "--engine-url", engine_url, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            if service.poll() is not None:
                raise RuntimeError(f"{decide} serve exited with {service.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    return (time.monotonic() - started) * 1000, cpu_ms(service.pid)
            except httpx.TransportError:
                pass
            time.sleep(0.01)
    finally:
        service.terminate()
        service.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decide", required=True, help="the decide command of the venv to measure")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"# decide={args.decide} runs={args.runs} cpus={os.cpu_count()}")
    engine_port = free_port()
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.standin_vllm",
            str(engine_port),
            str(prepare_embedded_model()),
        ],
        cwd=ROOT,
    )
    try:
        engine_url = f"http://127.0.0.1:{engine_port}"
        wait_for_models(engine_url, process=engine, timeout_s=30)
        runs = [ready_ms(args.decide, engine_url) for _ in range(args.runs)]
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    print("ready_ms: " + " ".join(f"{ms:.0f}" for ms, _ in runs))
    print("ready_cpu_ms: " + " ".join(f"{cpu:.0f}" for _, cpu in runs))
    print(f"median_ready_ms: {statistics.median(ms for ms, _ in runs):.0f}")
    print(f"median_ready_cpu_ms: {statistics.median(cpu for _, cpu in runs):.0f}")


if __name__ == "__main__":
    main()
