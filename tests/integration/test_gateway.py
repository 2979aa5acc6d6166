"""``decide serve`` against ONE gateway URL (docs/fleet.md, "The gateway"): a real service process whose
``--engine-url`` names a stand-in gateway on loopback in front of two stand-in vLLM engines. Every engine
call goes through the gateway, on the paths the shipped HTTPRoute admits, and every decision read reaches
it as what llm-d's picker hashes: a token-id prompt with the tenant's ``cache_salt``."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from deploy.processes import free_port, wait_for_models
from readers.engines.vllm import OBJECTIVE_HEADER, OBJECTIVES, engine_cache_salt
from tests.integration.standin_gateway import StandInGateway
from tests.integration.standin_vllm import handler

pytestmark = pytest.mark.integration  # starts the service as a process and three loopback servers

ROOT = Path(__file__).resolve().parents[2]
ROUTE = ROOT / "deploy" / "k8s" / "components" / "gateway" / "gateway.yaml"
POOL = ROOT / "deploy" / "k8s" / "components" / "gateway" / "pool.yaml"
KEYS = {"alpha": "gateway-test-alpha-0123456789", "beta": "gateway-test-beta-0123456789"}


def objective_names() -> set[str]:
    """The InferenceObjectives the shipped overlay defines."""
    return {
        d["metadata"]["name"]
        for d in yaml.safe_load_all(POOL.read_text())
        if d and d["kind"] == "InferenceObjective"
    }


def route_paths() -> set[str]:
    """The paths the shipped HTTPRoute sends to the pool."""
    (route,) = [d for d in yaml.safe_load_all(ROUTE.read_text()) if d and d["kind"] == "HTTPRoute"]
    return {m["path"]["value"] for rule in route["spec"]["rules"] for m in rule["matches"]}


@pytest.fixture
def engines(embedded_model_dir):
    """Two stand-in vLLM engines, each counting the requests it answers."""
    counts, servers = [], []
    for _ in range(2):
        count = [0]

        class Counting(handler(str(embedded_model_dir))):
            def handle_one_request(self, _count=count):
                super().handle_one_request()
                if self.command:
                    _count[0] += 1

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        counts.append(count)
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers], counts
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_service_reads_through_one_gateway_url_with_token_ids_and_each_tenants_salt(engines, tmp_path):
    urls, counts = engines
    gateway = StandInGateway(urls)
    key_file = tmp_path / "api-keys"
    key_file.write_text("".join(f"{key} tenant={tenant}\n" for tenant, key in KEYS.items()))
    port = free_port()
    log = tmp_path / "service.log"
    with log.open("w") as out:
        service = subprocess.Popen(
            [sys.executable, "-m", "opendecide", "serve", "--engine", "vllm", "--engine-url", gateway.url,
             "--port", str(port), "--api-key-file", str(key_file), "--store", str(tmp_path / "store.sqlite3")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_models(url, process=service, log=log, path="/readyz")
        started = len(gateway.seen)
        body = {
            "state": "The parcel arrived two weeks late and the box was crushed.",
            "questions": {
                "late": {"type": "noul", "instructions": "Is the customer complaining?"},
                "topic": {"type": "choice", "instructions": "What is it about?",
                          "criteria": {"delivery": None, "billing": None, "product": None}},
            },
        }  # fmt: skip
        for key in KEYS.values():
            reply = httpx.post(
                f"{url}/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
            )
            assert reply.status_code == 200, reply.text
        # Nothing reaches an engine but through the gateway, and only on the route's paths.
        assert sum(count[0] for count in counts) == len(gateway.seen)
        assert {(r["method"], r["path"]) for r in gateway.seen} <= {
            ("GET", "/v1/models"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),  # the start-up image probe (a text model refuses it)
        }
        assert {r["path"] for r in gateway.seen} <= route_paths()
        assert {r["upstream"] for r in gateway.seen} == set(urls)  # one URL, both engines behind it
        decision_reads = [r["body"] for r in gateway.seen[started:]]
        assert decision_reads and all(r["method"] == "POST" for r in gateway.seen[started:])
        for read in decision_reads:
            assert isinstance(read["prompt"], list) and all(isinstance(t, int) for t in read["prompt"])
        salts = {read["cache_salt"] for read in decision_reads}
        assert salts == {engine_cache_salt(f"tenant:{tenant}") for tenant in KEYS}  # each tenant's own
        # Each read names the InferenceObjective of its tier, one the shipped manifests define:
        # one decision is interactive, a /decide/batch is the batch tier.
        interactive = {r["headers"].get(OBJECTIVE_HEADER) for r in gateway.seen[started:]}
        batch_started = len(gateway.seen)
        batch = {
            "states": ["It came late.", "It came early."],
            "questions": {"late": body["questions"]["late"]},
        }
        reply = httpx.post(
            f"{url}/decide/batch",
            json=batch,
            headers={"Authorization": f"Bearer {KEYS['alpha']}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        batched = {r["headers"].get(OBJECTIVE_HEADER) for r in gateway.seen[batch_started:]}
        assert interactive == {"decide-interactive"} and batched == {"decide-batch"}
        assert {OBJECTIVES["interactive"], OBJECTIVES["batch"]} <= objective_names()
    finally:
        service.terminate()
        service.wait(timeout=30)
        gateway.close()
