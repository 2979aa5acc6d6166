"""Routing over two real vLLM-CPU engines: a request stays on one engine, affinity beats round-robin
on the prefix cache, the service counts reads per engine, and a stopped engine is ejected.

Both engines serve the embedded model (float32, prefix caching on, a small KV cache); reads are built
in the shared-prefix layout by ``bench/routing.py``'s workload. Kept short: the machine has two cores.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench import routing as routing_bench
from deploy.processes import free_port
from deploy.vllm_cpu import ServerSpec, install, start, stop
from eval.capacity.sweep import long_states
from readers.engines.base import ReadMode
from readers.engines.routed import RoutedEngine
from readers.engines.routing import prefix_key, rendezvous_order
from service.app import create_app

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture(scope="module")
def two_engines(embedded_model_dir, tmp_path_factory):
    python = install()
    ports = [free_port(), free_port()]
    logs = tmp_path_factory.mktemp("routing")
    try:
        for i, port in enumerate(ports):
            spec = ServerSpec(
                str(embedded_model_dir),
                routing_bench.SERVED_NAME,
                port=port,
                kv_cache_bytes=400 << 20,
                max_num_seqs=8,
            )
            start(spec, python=python, log=logs / f"engine-{i}.log")
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        for port in ports:
            stop(port)


def spread_requests(tokenizer, urls: list[str], first_seed: int):
    """Six states' requests (three questions each) whose prefixes favour both engines. The engines'
    ports are free ports, so which engine a state's key favours changes from run to run; six states
    land on one engine 1 time in 32, and the test checks the spread, so states are drawn until the
    rendezvous order gives each engine at least one."""
    ids = [url.removeprefix("http://") for url in urls]  # an engine's id is its URL's netloc
    for seed in range(first_seed, first_seed + 20):
        requests = routing_bench.shared_prefix_requests(
            tokenizer, long_states(tokenizer, 256, 6, seed=seed), 3
        )
        if len({rendezvous_order(prefix_key(reads[0]), ids)[0] for reads in requests}) == len(ids):
            return requests
    raise AssertionError("no draw of six states favoured both engines")


async def test_affinity_keeps_requests_together_and_beats_round_robin_on_the_prefix_cache(two_engines):
    async with await RoutedEngine.connect(two_engines, read_mode=ReadMode.EXACT) as engine:
        tokenizer = engine.tokenizer
    rows = {}
    for seed, routing in enumerate(("affinity", "round_robin")):
        requests = spread_requests(tokenizer, two_engines, first_seed=50 + 100 * seed)
        assert all(read.prefix_tokens > 256 for reads in requests for read in reads)
        rows[routing] = await routing_bench.routing_pass(
            two_engines, routing, requests, visits=2, concurrency=2, seed=seed
        )
    affinity, round_robin = rows["affinity"], rows["round_robin"]
    assert affinity["requests"] == 12 and affinity["requests_split_across_engines"] == 0
    assert round_robin["requests_split_across_engines"] == 12  # 3 questions over 2 engines in turn
    assert all(stats["reads"] > 0 for stats in affinity["engines"].values())  # 6 states spread over both
    assert affinity["prefix_cache_queries"] > 0 and round_robin["prefix_cache_queries"] > 0
    # Round-robin computes each state's prefix on both engines; affinity once.
    assert affinity["prefix_cache_hit_rate"] > round_robin["prefix_cache_hit_rate"] + 0.05, rows


async def test_the_service_counts_reads_per_engine_and_a_stopped_engine_is_ejected(
    two_engines, embedded_model_dir
):
    async with await RoutedEngine.connect(
        two_engines, read_mode=ReadMode.EXACT, eject_s=(60.0, 60.0)
    ) as engine:
        # Off: each new choice question's prior would add three routed reads to the count below.
        transport = httpx.ASGITransport(app=create_app(engine, prior_correction="off"))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://decide.test", timeout=300
        ) as client:
            bodies = routing_bench.case_bodies(6, seed=7)
            replies = await asyncio.gather(*(client.post("/decide", json=body) for body in bodies))
            assert [reply.status_code for reply in replies] == [200] * 6
            metrics = (await client.get("/metrics")).text
            ids = [url.removeprefix("http://") for url in two_engines]
            # An engine no read went to has no series yet (affinity follows the free ports' hashes)
            counted = {
                i: _sample(metrics, f'decide_route_reads_total{{engine="{i}"}}', missing=0.0) for i in ids
            }
            assert sum(counted.values()) == 6
            assert all(
                _sample(metrics, f'decide_route_in_flight_reads{{engine="{i}"}}', missing=0.0) == 0
                for i in ids
            )

            stop(int(ids[1].rsplit(":", 1)[1]))  # the second engine goes away
            replies = await asyncio.gather(
                *(client.post("/decide", json=body) for body in routing_bench.case_bodies(12, seed=8))
            )
            assert [reply.status_code for reply in replies] == [200] * 12  # its reads retried on the first
            stats = engine.stats()
            assert stats[ids[1]]["state"] == "ejected" and stats[ids[1]]["ejections"] == 1
            metrics = (await client.get("/metrics")).text
            assert _sample(metrics, f'decide_route_ejections_total{{engine="{ids[1]}"}}') == 1
            assert _sample(metrics, f'decide_route_errors_total{{engine="{ids[1]}",kind="unreachable"}}') >= 1


def _sample(metrics: str, series: str, missing: float | None = None) -> float:
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    if missing is not None:
        return missing
    raise AssertionError(f"{series} not in /metrics")
