"""The gateway overlay (deploy/k8s/overlays/v6e-gateway): rendered by the real ``kubectl kustomize``, its
custom resources validated strictly against the published CRD schemas of the pinned releases (shipped in
tests/fixtures/crds with licence and sha256, see tests/deploy/crd_schemas.py), its built-in objects by
kubernetes-validate, and the references between them (route → pool → picker → engines → service URL)
asserted one by one."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from readers.engines.addresses import parse_engine_urls
from tests.deploy.crd_schemas import crd_validators, shipped_files, validate_custom
from tests.deploy.k8s_render import (
    KUBERNETES_VERSION,
    NAMESPACE,
    PINNED,
    SERVICE_COMMAND,
    TPU_IMAGE,
    container,
    env_of,
    find,
    flag_values,
    render,
    selects,
)

pytestmark = pytest.mark.integration  # every test reads what the kubectl CLI renders

OVERLAY = "overlays/v6e-gateway"
COMPONENT = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "components" / "gateway"
PICKER_IMAGE = (
    "ghcr.io/llm-d/llm-d-router-endpoint-picker@sha256:"
    "2e516fa1310da7be59b82beb1445362139597d6d553ef04d546716abe3aaaa70"
)
# The paths readers/engines/vllm.py calls; the route admits these and nothing else.
ENGINE_PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models"}
# Kinds with a published schema shipped in tests/fixtures/crds; HealthCheckPolicy (GKE) and PodMonitoring
# (Managed Prometheus) have none there and are asserted field by field.
SCHEMA_VALIDATED = {"Gateway", "HTTPRoute", "InferencePool", "InferenceObjective"}
FIELD_ASSERTED = {"HealthCheckPolicy", "PodMonitoring"}


@pytest.fixture(scope="module")
def docs() -> tuple[dict, ...]:
    return render(OVERLAY)


def the(docs, kind: str) -> dict:
    (hit,) = [d for d in docs if d["kind"] == kind]
    return hit


def test_shipped_schemas_are_the_recorded_files_with_their_licences():
    files = shipped_files()
    assert {p.name for p in files} >= {
        "inference.networking.k8s.io_inferencepools.yaml",
        "llm-d.ai_inferenceobjectives.yaml",
        "gateway.networking.k8s.io_httproutes.yaml",
        "gateway.networking.k8s.io_gateways.yaml",
        "LICENSE",
    }
    assert all("Apache License" in p.read_text() for p in files if p.name == "LICENSE")
    # crd_validators checks every sha256 before building a validator.
    assert {("inference.networking.k8s.io/v1", "InferencePool"), ("llm-d.ai/v1alpha2", "InferenceObjective"),
            ("gateway.networking.k8s.io/v1", "HTTPRoute"), ("gateway.networking.k8s.io/v1", "Gateway")} <= set(crd_validators())  # fmt: skip


def test_every_object_is_validated_against_a_pinned_schema_or_asserted(docs):
    kinds = {d["kind"] for d in docs}
    assert SCHEMA_VALIDATED <= kinds
    validated = 0
    for doc in docs:
        assert doc["metadata"].get("namespace") == NAMESPACE or doc["kind"] == "Namespace", doc["metadata"]
        if doc["kind"] in SCHEMA_VALIDATED:
            validate_custom(doc)
        elif doc["kind"] in FIELD_ASSERTED:
            continue  # test_health_check_policy_fields, tests/deploy/test_k8s.py's PodMonitoring test
        else:
            assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
        validated += 1
    assert validated == len(docs) - sum(d["kind"] in FIELD_ASSERTED for d in docs)


@pytest.mark.parametrize(
    "kind, break_it",
    [
        ("InferencePool", lambda d: d["spec"].update(targetPort=[{"number": 8000}])),  # misspelt field
        ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].update(failureMode="Open")),  # not in enum
        ("InferencePool", lambda d: d["spec"]["targetPorts"][0].update(number=0)),  # below the minimum
        ("InferencePool", lambda d: d["spec"].pop("selector")),  # required
        ("InferenceObjective", lambda d: d["spec"].update(priority="high")),  # wrong type
        ("InferenceObjective", lambda d: d["spec"]["poolRef"].pop("name")),  # required
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["backendRefs"][0].update(weigth=1)),  # misspelt
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(type="Glob")),
        ("Gateway", lambda d: d["spec"]["listeners"][0].update(port=70000)),  # above the maximum
    ],
    ids=[
        "pool-unknown-field",
        "pool-enum",
        "pool-minimum",
        "pool-required",
        "objective-type",
        "objective-required",
        "route-unknown-field",
        "route-enum",
        "gateway-maximum",
    ],  # fmt: skip
)
def test_schema_validation_rejects_a_planted_wrong_field(docs, kind, break_it):
    broken = copy.deepcopy([d for d in docs if d["kind"] == kind][0])
    validate_custom(broken)  # the rendered object itself passes ...
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):  # ... and fails once broken
        validate_custom(broken)


def test_the_service_reads_through_one_gateway_url(docs):
    service = container(find(docs, "Deployment", "opendecide-service"), "service")
    expected = [*SERVICE_COMMAND]
    expected[expected.index("--engine-url") + 1] = "$(ENGINE_URL)"
    assert service["command"] == expected
    url = env_of(service)["ENGINE_URL"]["value"]
    # The service's own parser: one URL, not a list and not a dns+ name, so the service routes nothing.
    assert parse_engine_urls(url) == ([url], False)
    gateway = the(docs, "Gateway")
    (address,) = gateway["spec"]["addresses"]
    (listener,) = gateway["spec"]["listeners"]
    assert (address["type"], listener["protocol"], listener["port"]) == ("IPAddress", "HTTP", 80)
    assert (urlsplit(url).scheme, urlsplit(url).hostname, urlsplit(url).port or 80) == (
        "http",
        address["value"],
        80,
    )
    assert gateway["spec"]["gatewayClassName"] == "gke-l7-regional-internal-managed"  # internal: VPC only


def test_route_pool_picker_and_engines_reference_each_other(docs):
    gateway, route, pool = the(docs, "Gateway"), the(docs, "HTTPRoute"), the(docs, "InferencePool")
    assert [(p["kind"], p["name"]) for p in route["spec"]["parentRefs"]] == [
        ("Gateway", gateway["metadata"]["name"])
    ]
    (rule,) = route["spec"]["rules"]
    assert {m["path"]["value"] for m in rule["matches"]} == ENGINE_PATHS
    assert all(m["path"]["type"] == "Exact" for m in rule["matches"])
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}
    ]

    engine = find(docs, "Deployment", "vllm-engine")
    assert selects(pool["spec"]["selector"]["matchLabels"], engine)
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [
        p["containerPort"] for p in container(engine, "vllm")["ports"]
    ]
    assert container(engine, "vllm")["image"] == TPU_IMAGE  # the v6e fleet, unchanged

    picker_ref = pool["spec"]["endpointPickerRef"]
    assert picker_ref["failureMode"] == "FailOpen"
    picker_service = find(docs, "Service", picker_ref["name"])
    ext_proc = {p["port"]: p for p in picker_service["spec"]["ports"]}[picker_ref["port"]["number"]]
    assert ext_proc["appProtocol"] == "kubernetes.io/h2c"
    picker = find(docs, "Deployment", "opendecide-picker")
    assert selects(picker_service["spec"]["selector"], picker)
    epp = container(picker, "epp")
    assert {p["name"]: p["containerPort"] for p in epp["ports"]}["grpc"] == picker_ref["port"]["number"]
    flags = flag_values(epp["args"])
    assert (flags["--pool-name"], flags["--pool-namespace"], flags["--pool-group"]) == (
        pool["metadata"]["name"],
        NAMESPACE,
        "inference.networking.k8s.io",
    )
    for objective in (d for d in docs if d["kind"] == "InferenceObjective"):
        assert objective["spec"]["poolRef"]["name"] == pool["metadata"]["name"]
    priorities = {
        d["metadata"]["name"]: d["spec"]["priority"] for d in docs if d["kind"] == "InferenceObjective"
    }
    assert priorities["decide-interactive"] > priorities["decide-batch"]


def test_picker_runs_the_pinned_image_with_the_charts_resources_and_its_config(docs):
    picker = find(docs, "Deployment", "opendecide-picker")
    epp = container(picker, "epp")
    assert epp["image"] == PICKER_IMAGE and PINNED.match(epp["image"])
    assert epp["resources"]["requests"] == {"cpu": "8", "memory": "8Gi"}  # llm-d router v0.10.0 chart values
    assert picker["spec"]["replicas"] == 1 and picker["spec"]["strategy"] == {"type": "Recreate"}
    # --config-file names a key of the mounted ConfigMap, and that key holds the shipped scoring config.
    config_path = Path(flag_values(epp["args"])["--config-file"])
    (mount,) = [m for m in epp["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in picker["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    config_map = find(docs, "ConfigMap", "opendecide-picker-config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    config = yaml.safe_load(config_map["data"][config_path.name])
    assert config == yaml.safe_load((COMPONENT / "picker-config.yaml").read_text())
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}
    # The picker reads the cluster: its token is mounted, and its Role only reads.
    role = the(docs, "Role")
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} == {"get", "watch", "list"}
    binding = the(docs, "RoleBinding")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": picker["spec"]["template"]["spec"]["serviceAccountName"],
            "namespace": NAMESPACE,
        }
    ]


def test_engines_admit_the_picker_and_the_gateway_proxies_only(docs):
    policy = find(docs, "NetworkPolicy", "vllm-engine-ingress")["spec"]
    picker, service = (
        find(docs, "Deployment", "opendecide-picker"),
        find(docs, "Deployment", "opendecide-service"),
    )
    pods = [peer["podSelector"]["matchLabels"] for rule in policy["ingress"] for peer in rule["from"]
            if "podSelector" in peer and "namespaceSelector" not in peer]  # fmt: skip
    assert sum(selects(labels, picker) for labels in pods) == 1
    assert sum(selects(labels, service) for labels in pods) == 1
    blocks = [
        peer["ipBlock"]["cidr"] for rule in policy["ingress"] for peer in rule["from"] if "ipBlock" in peer
    ]
    # The proxy-only subnet ships as a documentation range (RFC 5737) to be replaced; the rest are GKE's
    # load-balancer health-check ranges. Nothing wider.
    assert blocks == ["192.0.2.0/24", "35.191.0.0/16", "130.211.0.0/22"]
    assert all(rule["ports"] == [{"protocol": "TCP", "port": 8000}] for rule in policy["ingress"])


def test_health_check_policy_fields(docs):
    """A GKE CRD with no published schema shipped here: its fields are asserted instead."""
    policy = the(docs, "HealthCheckPolicy")
    assert policy["apiVersion"] == "networking.gke.io/v1"
    assert set(policy["spec"]) == {"targetRef", "default"}
    pool = the(docs, "InferencePool")
    assert policy["spec"]["targetRef"] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": pool["metadata"]["name"],
    }
    check = policy["spec"]["default"]["config"]
    engine = container(find(docs, "Deployment", "vllm-engine"), "vllm")
    assert check["type"] == "HTTP"
    assert check["httpHealthCheck"] == {
        "requestPath": engine["livenessProbe"]["httpGet"]["path"],
        "port": 8000,
    }


def test_the_fleet_without_the_gateway_is_unchanged():
    """The own router stays the default: overlays/v6e still routes in the service over the headless name."""
    service = container(find(render("overlays/v6e"), "Deployment", "opendecide-service"), "service")
    assert service["command"] == SERVICE_COMMAND
    assert not [
        d
        for d in render("overlays/v6e")
        if re.match(r"(gateway|inference)\.networking|llm-d\.ai", d["apiVersion"])
    ]
