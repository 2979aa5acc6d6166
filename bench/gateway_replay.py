"""Routing quality by trace replay: the service's own router against the gateway's endpoint picker, simulated.

A SIMULATION, not a measurement: no engine runs. Two steps, one command each:

1. **Record** a decision trace: the real service (``service.app.create_app``, two tenants with their own
   cache salts) answers decisions in process over a function engine that keeps every read it is asked
   for: the prompt token ids (the embedded model's tokenizer and the shipped prompt layout), the shared
   prefix length and the ``cache_salt`` the vllm engine would send (``engine_cache_salt``). Decisions are
   the shipped tasks' records (SST-2, AG News, emotion, irony; one to four questions on one state) plus
   ``bench/routing.py``'s 384-token states with three questions, each state asked twice, some by both
   tenants. Content-free prior reads are in the trace as the service makes them.
2. **Replay** it against three routing policies on one simulated pool of ``--engines`` vLLM engines:

   - ``affinity`` and ``round_robin``: this project's router, the real ``readers.engines.routing.RoutingPolicy``
     fed the pool's reads in flight per engine, with ``RoutedEngine.read_many``'s rule that a request's
     reads follow its first read (``spill_after`` = ``--max-num-seqs``, the service's default);
   - ``picker``: llm-d router v0.10.0's documented default scoring, per read (each read is its own HTTP
     request through a gateway): ``2 × queue + 2 × KV-cache + 3 × prefix``, weights read from the
     shipped ``deploy/k8s/components/gateway/picker-config.yaml``; queue = (max − own waiting) ÷
     (max − min waiting), 1 when all equal; KV-cache = 1 − the engine's share of KV blocks held by
     running reads; prefix = the share of the read's 64-token blocks (partial last block included, the
     first hashed with the model name and the salt) that the picker's own index last sent to that
     engine, longest leading run. Highest total wins, ties at random.

   The pool model is the one ``bench/routing.py`` measured, in miniature: each engine runs at most
   ``--max-num-seqs`` reads at once and queues the rest; its prefix cache holds ``--kv-blocks`` blocks
   of ``--engine-block`` tokens per salt, whole blocks only, least recently used evicted; a read costs
   ``--base-ms`` plus ``--ms-per-token`` per prompt token not served from that cache. Requests arrive
   Poisson at ``--load`` × the pool's capacity with an empty cache. Reported per policy: the prefix-cache
   hit rate (tokens served from the cache ÷ prompt tokens), reads per engine (max ÷ mean), busy time per
   engine (max ÷ mean), requests split across engines, and p50/p99 latency in the model's units; the hit
   rate again by how long a read's shared prefix is.

   Favourable to the picker by construction: its metrics are exact and instantaneous (the real one scrapes
   ``/metrics`` periodically) and its index is updated before the next read is scored (the real one
   updates it asynchronously).

Run:

    .venv/bin/python -m bench.gateway_replay record --out evidence/gateway-replay-$(date -u +%F)
    .venv/bin/python -m bench.gateway_replay replay --out evidence/gateway-replay-$(date -u +%F)

``record`` writes ``trace.jsonl.gz`` (one read a line) and ``trace-manifest.json``; ``replay`` reads the
trace and writes ``replay.json`` (results + the run manifest) and ``replay.md``; both append to ``command.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import heapq
import json
import random
import shlex
import statistics
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from bench import ROOT
from readers.engines.base import ReadRequest
from readers.engines.routing import RoutingPolicy

PICKER_CONFIG = ROOT / "deploy" / "k8s" / "components" / "gateway" / "picker-config.yaml"
PICKER_BLOCK_TOKENS = 64
"""The picker's prefix block: llm-d router v0.10.0 floors its block size at 64 tokens (``minBlockSizeTokens``
in its approximate prefix producer) whatever vLLM's own block size is, when that is smaller."""
POLICIES = ("affinity", "round_robin", "picker")
PREFIX_CLASSES = ((0, 64, "shared prefix < 64 tokens"), (64, 128, "64–127"), (128, 1 << 30, "≥ 128"))
TENANTS = ("alpha", "beta")


# -- the trace -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracedRead:
    request: int
    call: int
    """The engine call the read came in (``read`` or one ``read_many``): a routed engine places a call's
    reads together."""
    salt: str
    prompt_ids: tuple[int, ...]
    prefix_tokens: int

    def as_read_request(self) -> ReadRequest:
        # The router keys on the salt and the shared prefix only; labels do not route.
        return ReadRequest(self.prompt_ids, (), (), prefix_tokens=self.prefix_tokens, cache_salt=self.salt)


def read_trace(path: Path) -> list[list[TracedRead]]:
    """``trace.jsonl.gz`` → the reads of each request, in request order."""
    requests: dict[int, list[TracedRead]] = {}
    with gzip.open(path, "rt") as lines:
        for line in lines:
            row = json.loads(line)
            read = TracedRead(
                row["request"], row["call"], row["salt"], tuple(row["prompt_ids"]), row["prefix_tokens"]
            )
            requests.setdefault(read.request, []).append(read)
    return [requests[i] for i in sorted(requests)]


def trace_bodies(tokenizer, *, states_per_task: int, long_states: int, seed: int) -> list[tuple[str, dict]]:
    """(tenant, decision body) in send order: every state twice, the second visit after all first visits;
    one state in three asked by both tenants."""
    from eval.capacity.sweep import long_states as make_long_states
    from eval.decisions.tasks import TASKS, load_sample

    rng = random.Random(seed)
    firsts = []
    for task in ("sst2", "ag_news", "emotion", "irony"):
        for record in load_sample(task)[:states_per_task]:
            # One to four questions on one state: the task's own, then others' that also read plain text.
            extra = rng.sample(
                [t for t in ("sst2", "ag_news", "emotion", "irony") if t != task], rng.randrange(4)
            )
            questions = {name: TASKS[name].question() for name in (task, *extra)}
            firsts.append({"state": record.text, "questions": questions})
    for text in make_long_states(tokenizer, 384, long_states, seed=seed):
        questions = {name: TASKS[name].question() for name in ("sst2", "emotion", "irony")}
        firsts.append({"state": text, "questions": questions})
    rng.shuffle(firsts)
    sends = []
    for visit in range(2):
        order = list(range(len(firsts)))
        if visit:
            rng.shuffle(order)
        for i in order:
            tenants = TENANTS if i % 3 == 0 else (TENANTS[i % 2],)
            sends += [(tenant, firsts[i]) for tenant in tenants]
    return sends


async def record(out: Path, *, states_per_task: int, long_states: int, seed: int) -> dict:
    """Run the real service over a recording function engine; write the trace (see the module docstring)."""
    import httpx
    from transformers import AutoTokenizer

    from readers.embedded import model_manifest, prepare_embedded_model
    from readers.engines.base import Capabilities, EngineReply, ModelInfo, ReadMode
    from readers.engines.function import FunctionEngine
    from readers.engines.vllm import engine_cache_salt
    from service.app import create_app

    model_dir = prepare_embedded_model()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    manifest = model_manifest(model_dir)
    info = ModelInfo(manifest["name"], manifest["revision"], manifest.get("description", ""),
                     manifest.get("release_date", ""), tokenizer.model_max_length, len(tokenizer))  # fmt: skip
    current = {"request": 0, "call": 0}
    rows: list[dict] = []

    def keep(request: ReadRequest) -> EngineReply:
        rows.append({"request": current["request"], "call": current["call"], "salt": engine_cache_salt(request.cache_salt or ""),
                     "prompt_ids": list(request.prompt_ids), "prefix_tokens": request.prefix_tokens})  # fmt: skip
        return EngineReply(
            {t: -0.5 - i for i, t in enumerate(request.label_ids)},
            ReadMode.EXACT,
            len(request.prompt_ids),
            1.0,
        )

    class Recorder(FunctionEngine):
        """Notes which engine call each read came in: one ``read``, or all of one ``read_many``."""

        async def read(self, request: ReadRequest) -> EngineReply:
            current["call"] += 1
            return await super().read(request)

        async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
            current["call"] += 1
            return [await FunctionEngine.read(self, request) for request in requests]

    capabilities = Capabilities(
        read_mode=ReadMode.EXACT, max_logprobs=32, top_k=32, probe={"engine": "trace recorder"}
    )
    engine = Recorder(keep, tokenizer=tokenizer, info=info, capabilities=capabilities)
    keys = {tenant: f"trace-{tenant}-{'k' * 20}" for tenant in TENANTS}
    app = create_app(engine, api_keys=[f"{key} tenant={tenant}" for tenant, key in keys.items()])
    sends = trace_bodies(tokenizer, states_per_task=states_per_task, long_states=long_states, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://decide.test", timeout=120) as client:
        for i, (tenant, body) in enumerate(sends):
            current["request"] = i  # one decision at a time: its reads are exactly this request's
            reply = await client.post(
                "/decide", json=body, headers={"Authorization": f"Bearer {keys[tenant]}"}
            )
            if reply.status_code != 200:
                raise RuntimeError(f"decision {i} answered {reply.status_code}: {reply.text[:300]}")
    with gzip.open(out / "trace.jsonl.gz", "wt") as lines:
        for row in rows:
            lines.write(json.dumps(row, separators=(",", ":")) + "\n")
    summary = {
        "requests": len(sends), "reads": len(rows), "tenants": list(TENANTS),
        "prompt_tokens_median": statistics.median(len(r["prompt_ids"]) for r in rows),
        "prefix_tokens_median": statistics.median(r["prefix_tokens"] for r in rows),
        "model": {"name": info.name, "revision": info.revision},
        "args": {"states_per_task": states_per_task, "long_states": long_states, "seed": seed},
        "trace_sha256": hashlib.sha256((out / "trace.jsonl.gz").read_bytes()).hexdigest(),
    }  # fmt: skip
    (out / "trace-manifest.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# -- the simulated pool ------------------------------------------------------------------------------


def block_hashes(salt: str, ids: Sequence[int], block: int, *, partial: bool) -> list[bytes]:
    """Chained hashes of ``ids`` in blocks of ``block`` tokens, the first seeded with ``salt`` (vLLM's
    ``cache_salt`` and the picker both hash it into the first block); ``partial`` hashes a last short block too."""
    hashes, previous = [], hashlib.blake2b(salt.encode(), digest_size=8).digest()
    end = len(ids) if partial else len(ids) - len(ids) % block
    for start in range(0, end, block):
        previous = hashlib.blake2b(
            previous + array("q", ids[start : start + block]).tobytes(), digest_size=8
        ).digest()
        hashes.append(previous)
    return hashes


@dataclass
class Engine:
    slots: int
    kv_blocks: int
    cache: OrderedDict = field(default_factory=OrderedDict)  # block hash → None, least recent first
    running: int = 0
    running_blocks: int = 0
    waiting: list = field(default_factory=list)  # reads not yet started, FIFO
    reads: int = 0
    busy_ms: float = 0.0

    def cached_blocks(self, hashes: list[bytes]) -> int:
        hit = 0
        for h in hashes:
            if h not in self.cache:
                break
            hit += 1
        return hit

    def keep(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self.cache[h] = None
            self.cache.move_to_end(h)
        while len(self.cache) > self.kv_blocks:
            self.cache.popitem(last=False)


class PickerIndex:
    """The picker's approximate prefix index: which engine it last sent each 64-token block to (LRU per engine)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.by_engine: dict[int, OrderedDict] = {}

    def matched(self, hashes: list[bytes], engine: int) -> int:
        seen = self.by_engine.get(engine, OrderedDict())
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        return hit

    def add(self, hashes: list[bytes], engine: int) -> None:
        seen = self.by_engine.setdefault(engine, OrderedDict())
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.capacity:
            seen.popitem(last=False)


def picker_weights(path: Path = PICKER_CONFIG) -> dict[str, float]:
    """The scorer weights of the shipped picker config's default profile."""
    (profile,) = yaml.safe_load(path.read_text())["schedulingProfiles"]
    return {p["pluginRef"]: float(p.get("weight", 1)) for p in profile["plugins"]}


def picker_choice(
    engines: list[Engine], hashes: list[bytes], index: PickerIndex, weights: dict, rng: random.Random
) -> int:
    """llm-d router v0.10.0's default scoring of one read (see the module docstring)."""
    queues = [len(e.waiting) for e in engines]
    low, high = min(queues), max(queues)
    best, chosen = None, []
    for i, e in enumerate(engines):
        queue = 1.0 if high == low else (high - queues[i]) / (high - low)
        kv = 1.0 - e.running_blocks / e.kv_blocks
        prefix = index.matched(hashes, i) / len(hashes) if hashes else 0.0
        score = (weights["queue-scorer"] * queue + weights["kv-cache-utilization-scorer"] * kv
                 + weights["prefix-cache-scorer"] * prefix)  # fmt: skip
        if best is None or score > best + 1e-12:
            best, chosen = score, [i]
        elif abs(score - best) <= 1e-12:
            chosen.append(i)
    return rng.choice(chosen)


def replay(requests: list[list[TracedRead]], policy: str, args: argparse.Namespace) -> dict:
    """One policy over the trace on a fresh pool; the figures of the module docstring."""
    rng = random.Random(args.seed)
    engines = [Engine(args.max_num_seqs, args.kv_blocks) for _ in range(args.engines)]
    ids = [str(i) for i in range(args.engines)]
    router = RoutingPolicy(
        "affinity" if policy == "affinity" else "round_robin", spill_after=args.max_num_seqs
    )
    index = PickerIndex(args.kv_blocks * args.engine_block // PICKER_BLOCK_TOKENS)
    weights = picker_weights()
    # Capacity with an empty cache: every token computed.
    mean_cost = statistics.mean(
        args.base_ms + args.ms_per_token * len(r.prompt_ids) for req in requests for r in req
    )
    reads_per_request = statistics.mean(len(req) for req in requests)
    capacity = args.engines * args.max_num_seqs / (mean_cost / 1000) / reads_per_request  # requests/s
    arrivals = (
        np.cumsum(np.random.default_rng(args.seed).exponential(1 / (args.load * capacity), len(requests)))
        * 1000
    )
    events: list = [(float(t), 0, n, "arrive", n) for n, t in enumerate(arrivals)]
    heapq.heapify(events)
    tick = len(events)
    hit_tokens = prompt_tokens = 0
    by_class = {label: [0, 0] for _, _, label in PREFIX_CLASSES}
    latencies: list[float] = []
    split = 0

    def start(engine_id: int, now: float) -> None:
        nonlocal tick, hit_tokens, prompt_tokens
        e = engines[engine_id]
        while e.waiting and e.running < e.slots:
            read, arrived = e.waiting.pop(0)
            hashes = block_hashes(read.salt, read.prompt_ids, args.engine_block, partial=False)
            cached = e.cached_blocks(hashes) * args.engine_block
            cost = args.base_ms + args.ms_per_token * (len(read.prompt_ids) - cached)
            e.running += 1
            e.running_blocks += -(-len(read.prompt_ids) // args.engine_block)
            e.keep(hashes)  # its blocks are in use, so the most recent
            hit_tokens += cached
            prompt_tokens += len(read.prompt_ids)
            for low, high, label in PREFIX_CLASSES:
                if low <= read.prefix_tokens < high:
                    by_class[label][0] += cached
                    by_class[label][1] += len(read.prompt_ids)
            e.reads += 1
            e.busy_ms += cost
            tick += 1
            heapq.heappush(events, (now + cost, 1, tick, "done", (engine_id, read, arrived)))

    while events:
        now, _, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            reads = requests[payload]
            loads = {ids[i]: e.running + len(e.waiting) for i, e in enumerate(engines)}
            places = []
            for n, read in enumerate(reads):
                if policy == "picker":  # every read is its own HTTP request through the gateway
                    hashes = block_hashes(read.salt, read.prompt_ids, PICKER_BLOCK_TOKENS, partial=True)
                    place = picker_choice(engines, hashes, index, weights, rng)
                    index.add(hashes, place)
                elif policy == "affinity" and n and read.call == reads[n - 1].call:
                    place = places[-1]  # RoutedEngine.read_many: a call's reads follow its first
                else:
                    place = int(router.choose(loads, read.as_read_request()))
                engines[place].waiting.append((read, now))
                loads[ids[place]] += 1
                places.append(place)
            split += len(set(places)) > 1
            for place in sorted(set(places)):
                start(place, now)
        else:
            engine_id, read, arrived = payload
            e = engines[engine_id]
            e.running -= 1
            e.running_blocks -= -(-len(read.prompt_ids) // args.engine_block)
            latencies.append(now - arrived)
            start(engine_id, now)
    reads = [e.reads for e in engines]
    busy = [e.busy_ms for e in engines]
    return {
        "policy": policy, "requests": len(requests), "reads": sum(reads),
        "prefix_cache_hit_rate": hit_tokens / prompt_tokens, "prefix_cache_hits": hit_tokens, "prompt_tokens": prompt_tokens,
        "hit_rate_by_shared_prefix": {label: (h / p if p else None) for label, (h, p) in by_class.items()},
        "prompt_tokens_by_shared_prefix": {label: p for label, (_, p) in by_class.items()},
        "reads_per_engine": reads, "reads_max_over_mean": max(reads) / statistics.mean(reads),
        "busy_max_over_mean": max(busy) / statistics.mean(busy),
        "requests_split_across_engines": split,
        "p50_latency_model_ms": float(np.percentile(latencies, 50)), "p99_latency_model_ms": float(np.percentile(latencies, 99)),
        "offered_requests_per_s": args.load * capacity,
    }  # fmt: skip


def report(outcome: dict) -> str:
    rows = outcome["policies"]
    lines = [
        f"SIMULATION (no engine ran): {outcome['trace']['requests']} recorded decisions, {outcome['trace']['reads']} reads, "
        f"{outcome['args']['engines']} simulated engines, load {outcome['args']['load']:g} of the pool's cold-cache capacity.",
        "",
        "| policy | prefix-cache hit rate | reads per engine, max ÷ mean | busy time, max ÷ mean | requests split | p50 / p99 latency (model ms) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in rows:
        lines.append(f"| {row['policy']} | {row['prefix_cache_hit_rate']:.3f} | {row['reads_max_over_mean']:.2f} | "
                     f"{row['busy_max_over_mean']:.2f} | {row['requests_split_across_engines']} of {row['requests']} | "
                     f"{row['p50_latency_model_ms']:.0f} / {row['p99_latency_model_ms']:.0f} |")  # fmt: skip
    labels = [label for _, _, label in PREFIX_CLASSES]
    lines += [
        "",
        "| policy | " + " | ".join(f"hit rate, {label}" for label in labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for row in rows:
        cells = [
            "—"
            if row["hit_rate_by_shared_prefix"][label] is None
            else f"{row['hit_rate_by_shared_prefix'][label]:.3f}"
            for label in labels
        ]
        lines.append(f"| {row['policy']} | " + " | ".join(cells) + " |")
    shares = rows[0]["prompt_tokens_by_shared_prefix"]
    total = sum(shares.values())
    lines += [
        "",
        "Prompt tokens by shared prefix: "
        + ", ".join(f"{label} {shares[label] / total:.0%}" for label in labels)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("step", choices=("record", "replay"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--states-per-task", type=int, default=40, help="record: shipped records per task")
    p.add_argument(
        "--long-states", type=int, default=12, help="record: 384-token states (bench/routing.py's)"
    )
    p.add_argument("--engines", type=int, default=4)
    p.add_argument(
        "--max-num-seqs", type=int, default=16, help="reads an engine runs at once (the deploy flag)"
    )
    p.add_argument("--kv-blocks", type=int, default=4096, help="prefix-cache blocks per engine")
    p.add_argument("--engine-block", type=int, default=16, help="vLLM's KV block, tokens (its GPU default)")
    p.add_argument(
        "--base-ms", type=float, default=10.0, help="model cost of a read beyond its computed tokens"
    )
    p.add_argument("--ms-per-token", type=float, default=0.1, help="model cost of one computed prompt token")
    p.add_argument("--load", type=float, default=0.7, help="arrival rate ÷ the pool's cold-cache capacity")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    print("args:", json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}))
    random.seed(args.seed)
    np.random.seed(args.seed)
    if args.step == "record":
        outcome = asyncio.run(
            record(
                args.out, states_per_task=args.states_per_task, long_states=args.long_states, seed=args.seed
            )
        )
        print(json.dumps(outcome, indent=2))
    else:
        from eval.evidence.manifest import run_manifest, write_json

        requests = read_trace(args.out / "trace.jsonl.gz")
        trace = json.loads((args.out / "trace-manifest.json").read_text())
        outcome = {
            "simulation": True,
            "manifest": run_manifest("gateway-replay", engines={}, args={k: v for k, v in vars(args).items() if k != "out"}),
            "trace": trace, "args": {k: v for k, v in vars(args).items() if k != "out"},
            "picker_weights": picker_weights(), "picker_block_tokens": PICKER_BLOCK_TOKENS,
            "policies": [replay(requests, policy, args) for policy in POLICIES],
        }  # fmt: skip
        write_json(args.out / "replay.json", outcome)
        (args.out / "replay.md").write_text(report(outcome))
        print(report(outcome))
    with (args.out / "command.txt").open("a") as commands:
        commands.write(
            shlex.join([sys.executable, "-m", "bench.gateway_replay", *(argv or sys.argv[1:])]) + "\n"
        )
    return outcome


if __name__ == "__main__":
    main()
