"""The GKE fleet manifests (deploy/k8s): every overlay rendered by the real ``kubectl kustomize``, every
built-in object validated offline by kubernetes-validate (strict, pinned Kubernetes version), and the fields
the fleet depends on asserted one by one.

kubernetes-validate ships schemas for built-in kinds only. PodMonitoring (monitoring.googleapis.com/v1,
a Managed Prometheus CRD) has none there, so its fields are asserted explicitly in
``test_pod_monitoring_fields`` instead of being skipped silently.
"""

from __future__ import annotations

import copy
import json
import re
from urllib.parse import urlsplit

import kubernetes_validate
import pytest

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


L4_IMAGE = "vllm/vllm-openai@sha256:07913e94a58a4e61322c88f8d4647411b4dd394838b53abacaa32448d9d8de0a"
# Marked as a placeholder in components/pin-images until an opendecide-service image is published.
SERVICE_IMAGE = "opendecide-service@sha256:" + "0" * 64
BASE_ENGINE_IMAGE = "vllm-engine"  # the base's placeholder name; every overlay must replace it

TPU_1X1 = {"cloud.google.com/gke-tpu-topology": "1x1"}
OVERLAYS = {
    "v6e": {
        "image": TPU_IMAGE,
        "node_selector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", **TPU_1X1},
        "chip": "google.com/tpu",
    },
    "v5e": {
        "image": TPU_IMAGE,
        "node_selector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice", **TPU_1X1},
        "chip": "google.com/tpu",
    },
    "l4": {
        "image": L4_IMAGE,
        "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        "chip": "nvidia.com/gpu",
    },
}
CHIP_RESOURCES = {"google.com/tpu", "nvidia.com/gpu"}

ENGINE_METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
CRD_GROUPS = {"monitoring.googleapis.com"}
EXPECTED_KINDS = {
    ("Namespace", "opendecide"),
    ("ConfigMap", "vllm-engine-config"),
    ("Deployment", "vllm-engine"),
    ("Deployment", "opendecide-service"),
    ("Service", "vllm-engine-headless"),
    ("Service", "opendecide-service"),
    ("PodDisruptionBudget", "vllm-engine"),
    ("PodDisruptionBudget", "opendecide-service"),
    ("HorizontalPodAutoscaler", "vllm-engine"),
    ("HorizontalPodAutoscaler", "opendecide-service"),
    ("NetworkPolicy", "vllm-engine-ingress"),
    ("PodMonitoring", "vllm-engine"),
    ("PodMonitoring", "opendecide-service"),
}


@pytest.fixture(params=sorted(OVERLAYS))
def overlay(request) -> str:
    return request.param


@pytest.fixture
def docs(overlay) -> tuple[dict, ...]:
    return render(f"overlays/{overlay}")


def test_every_overlay_renders_the_whole_fleet(docs):
    assert {(d["kind"], re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"])) for d in docs} == EXPECTED_KINDS
    assert all(d["metadata"].get("namespace") == NAMESPACE for d in docs if d["kind"] != "Namespace")


def test_builtin_manifests_valid_offline_for_all_overlays(docs):
    """Manifests valid offline for all overlays: each built-in object against the pinned version's strict schema."""
    validated = 0
    for doc in docs:
        if doc["apiVersion"].split("/")[0] in CRD_GROUPS:
            continue  # no schema in kubernetes-validate; asserted in test_pod_monitoring_fields
        assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
        validated += 1
    assert validated == len(EXPECTED_KINDS) - 2


@pytest.mark.parametrize(
    "break_it",
    [
        lambda d: container(d, "vllm").update(imagePullPolcy="Always"),  # misspelt field: strict rejects it
        lambda d: d["spec"].update(replicas="two"),
        lambda d: container(d, "vllm")["readinessProbe"]["httpGet"].pop("port"),
    ],
    ids=["unknown-field", "wrong-type", "missing-required"],
)
def test_validation_rejects_broken_manifests(break_it):
    broken = copy.deepcopy(find(render("overlays/v6e"), "Deployment", "vllm-engine"))
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_images_pinned_by_digest(overlay, docs):
    engine, service = find(docs, "Deployment", "vllm-engine"), find(docs, "Deployment", "opendecide-service")
    images = [c["image"] for d in (engine, service) for c in d["spec"]["template"]["spec"]["containers"]]
    assert all(PINNED.match(image) for image in images), images
    assert BASE_ENGINE_IMAGE not in images
    assert container(engine, "vllm")["image"] == OVERLAYS[overlay]["image"]
    assert container(service, "service")["image"] == SERVICE_IMAGE
    # The service reports the digests it runs with: its flags read the pinned references.
    env = env_of(container(service, "service"))
    assert env["ENGINE_IMAGE"]["value"] == OVERLAYS[overlay]["image"]
    assert env["SERVICE_IMAGE"]["value"] == SERVICE_IMAGE


def test_base_alone_leaves_the_engine_image_unpinned():
    """The reason the overlays exist: the base names a placeholder image and asks for no chip."""
    engine = container(find(render("base"), "Deployment", "vllm-engine"), "vllm")
    assert engine["image"] == BASE_ENGINE_IMAGE
    assert not CHIP_RESOURCES & set(engine["resources"].get("limits", {}))


def test_one_chip_per_engine_pod_on_the_right_nodes(overlay, docs):
    expected = OVERLAYS[overlay]
    pod = find(docs, "Deployment", "vllm-engine")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == expected["node_selector"]
    resources = container({"spec": {"template": {"spec": pod}}}, "vllm")["resources"]
    assert resources["limits"] == {expected["chip"]: "1"}
    assert resources["requests"][expected["chip"]] == "1"
    assert not (CHIP_RESOURCES - {expected["chip"]}) & (set(resources["limits"]) | set(resources["requests"]))
    assert any(t["key"] == expected["chip"] and t["effect"] == "NoSchedule" for t in pod["tolerations"])


def test_engine_serves_with_the_one_chip_flags(overlay, docs):
    engine = find(docs, "Deployment", "vllm-engine")
    vllm = container(engine, "vllm")
    assert vllm["command"] == ["vllm", "serve"] and vllm["args"][0] == "$(MODEL)"
    flags = flag_values(vllm["args"])
    assert flags == {
        "--host": "0.0.0.0",
        "--port": "8000",
        "--tensor-parallel-size": "1",
        "--max-model-len": "$(MAX_MODEL_LEN)",
        "--max-num-seqs": "16",
        "--max-logprobs": "32",
        "--generation-config": "vllm",
        "--limit-mm-per-prompt": '{"image":0,"audio":0}',
        "--enable-prefix-caching": None,
        "--enable-prompt-tokens-details": None,
    }
    assert set(json.loads(flags["--limit-mm-per-prompt"]).values()) == {0}
    # $(MODEL) and $(MAX_MODEL_LEN) resolve from the rendered ConfigMap (hash-suffixed name included).
    config = find(docs, "ConfigMap", "vllm-engine-config")
    env = env_of(vllm)
    for key in ("MODEL", "MAX_MODEL_LEN"):
        ref = env[key]["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": config["metadata"]["name"], "key": key}
    assert config["data"]["MODEL"].startswith("google/gemma-4-") and int(config["data"]["MAX_MODEL_LEN"]) > 0
    assert [p["containerPort"] for p in vllm["ports"]] == [8000]


def test_probes(docs):
    engine = container(find(docs, "Deployment", "vllm-engine"), "vllm")
    for probe in ("startupProbe", "readinessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/v1/models", "port": "http"}
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {p["name"]: p["containerPort"] for p in engine["ports"]}["http"] == 8000

    service = container(find(docs, "Deployment", "opendecide-service"), "service")
    assert service["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert service["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in service["ports"]}["http"] == 8080
    assert service["command"] == SERVICE_COMMAND and "args" not in service


def test_service_reaches_engines_through_the_headless_service(docs):
    headless = find(docs, "Service", "vllm-engine-headless")
    service = container(find(docs, "Deployment", "opendecide-service"), "service")
    url = urlsplit(flag_values(service["command"])["--engine-url"])
    assert (url.hostname, url.port) == (headless["metadata"]["name"], 8000)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"].get("publishNotReadyAddresses", False) is False
    assert selects(headless["spec"]["selector"], find(docs, "Deployment", "vllm-engine"))
    assert [(p["port"], p["targetPort"]) for p in headless["spec"]["ports"]] == [(8000, "http")]
    front = find(docs, "Service", "opendecide-service")
    assert selects(front["spec"]["selector"], find(docs, "Deployment", "opendecide-service"))
    assert not selects(front["spec"]["selector"], find(docs, "Deployment", "vllm-engine"))


def test_autoscalers(docs):
    engine_hpa = find(docs, "HorizontalPodAutoscaler", "vllm-engine")
    assert engine_hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "vllm-engine",
    }
    (metric,) = engine_hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == ENGINE_METRIC
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert 1 <= engine_hpa["spec"]["minReplicas"] <= engine_hpa["spec"]["maxReplicas"]

    service_hpa = find(docs, "HorizontalPodAutoscaler", "opendecide-service")
    assert service_hpa["spec"]["scaleTargetRef"]["name"] == "opendecide-service"
    (metric,) = service_hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    # A CPU utilisation target needs a CPU request on every container it averages over.
    assert container(find(docs, "Deployment", "opendecide-service"), "service")["resources"]["requests"][
        "cpu"
    ]
    assert service_hpa["spec"]["minReplicas"] >= 2


def test_disruption_budgets_cover_both_deployments(docs):
    for name in ("vllm-engine", "opendecide-service"):
        pdb = find(docs, "PodDisruptionBudget", name)
        assert selects(pdb["spec"]["selector"]["matchLabels"], find(docs, "Deployment", name))
        assert pdb["spec"]["maxUnavailable"] == 1


def test_network_policy_admits_only_the_service_and_the_metrics_collector(docs):
    policy = find(docs, "NetworkPolicy", "vllm-engine-ingress")["spec"]
    engine, service = find(docs, "Deployment", "vllm-engine"), find(docs, "Deployment", "opendecide-service")
    assert selects(policy["podSelector"]["matchLabels"], engine)
    assert policy["policyTypes"] == ["Ingress"]
    peers = []
    for rule in policy["ingress"]:
        assert rule.get("from"), "a rule without `from` admits every source"
        assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
        peers.extend(rule["from"])
    assert all("ipBlock" not in peer for peer in peers)
    in_namespace = [p for p in peers if "namespaceSelector" not in p]
    assert len(in_namespace) == 1
    assert selects(in_namespace[0]["podSelector"]["matchLabels"], service)
    assert not selects(in_namespace[0]["podSelector"]["matchLabels"], engine)
    (collector,) = [p for p in peers if "namespaceSelector" in p]
    assert collector["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "gmp-system"}
    assert collector["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "collector"}


def test_no_secret_inline_anywhere(docs):
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert all(set(d) <= {"apiVersion", "kind", "metadata", "data"} for d in docs if d["kind"] == "ConfigMap")
    assert set(find(docs, "ConfigMap", "vllm-engine-config")["data"]) == {"MODEL", "MAX_MODEL_LEN"}
    for name in ("vllm-engine", "opendecide-service"):
        pod = find(docs, "Deployment", name)["spec"]["template"]["spec"]
        for c in pod["containers"]:
            env = env_of(c)
            assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
            assert "value" not in env["HF_TOKEN"]
            secretish = re.compile(r"TOKEN|KEY|SECRET|PASSWORD")
            literal = [e["name"] for e in env.values() if "value" in e and secretish.search(e["name"])]
            assert not literal, f"{name}: secret-looking env set inline: {literal}"
            assert "envFrom" not in c
    # API keys: the Secret mounted as one file, at the path --api-key-file reads.
    service_pod = find(docs, "Deployment", "opendecide-service")["spec"]["template"]["spec"]
    service = container(find(docs, "Deployment", "opendecide-service"), "service")
    key_file = flag_values(service["command"])["--api-key-file"]
    (volume,) = [v for v in service_pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "opendecide-api-keys"
    (mount,) = [m for m in service["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert [f"{mount['mountPath']}/{item['path']}" for item in volume["secret"]["items"]] == [key_file]


def test_service_runs_as_non_root(docs):
    service = find(docs, "Deployment", "opendecide-service")
    pod = service["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    context = container(service, "service")["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert service["spec"]["replicas"] >= 2
    assert pod["automountServiceAccountToken"] is False


def test_pod_monitoring_fields(docs):
    """PodMonitoring is a CRD without a schema in kubernetes-validate: its fields are asserted here instead."""
    known_spec = {"selector", "endpoints", "targetLabels", "limits", "filterRunning"}
    known_endpoint = {"port", "path", "interval", "scheme", "timeout", "metricRelabeling", "params", "proxyUrl",
                      "authorization", "basicAuth", "oauth2", "tls"}  # fmt: skip
    for name, container_name, port in (
        ("vllm-engine", "vllm", 8000),
        ("opendecide-service", "service", 9090),  # the metrics-only listener: no API key
    ):
        monitor = find(docs, "PodMonitoring", name)
        assert monitor["apiVersion"] == "monitoring.googleapis.com/v1"
        assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
        assert set(monitor["spec"]) <= known_spec
        deployment = find(docs, "Deployment", name)
        assert selects(monitor["spec"]["selector"]["matchLabels"], deployment)
        (endpoint,) = monitor["spec"]["endpoints"]
        assert set(endpoint) <= known_endpoint
        ports = {p["name"]: p["containerPort"] for p in container(deployment, container_name)["ports"]}
        assert ports[endpoint["port"]] == port
        assert endpoint["path"] == "/metrics"
        assert re.fullmatch(r"[0-9]+(ms|s|m)", endpoint["interval"])


def test_the_vision_overlay_serves_a_model_that_reads_images():
    """overlays/v6e-vision: the v6e fleet with components/vision, which the image reads need
    (readers/engines/vllm.py): images allowed per prompt, audio still zeroed, request templates trusted."""
    docs = render("overlays/v6e-vision")
    engine = find(docs, "Deployment", "vllm-engine")
    vllm = container(engine, "vllm")
    flags = flag_values(vllm["args"])
    assert json.loads(flags["--limit-mm-per-prompt"]) == {"image": 8, "audio": 0}
    assert "--trust-request-chat-template" in flags and flags["--enable-prefix-caching"] is None
    assert vllm["image"] == TPU_IMAGE
    config = find(docs, "ConfigMap", "vllm-engine-config")
    assert config["data"]["MODEL"] == "google/gemma-4-E4B-it"
    for doc in docs:
        if doc["apiVersion"].split("/")[0] not in CRD_GROUPS:
            assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    # The text overlays keep every modality at 0 (test_engine_serves_with_the_one_chip_flags).
    text = flag_values(container(find(render("overlays/v6e"), "Deployment", "vllm-engine"), "vllm")["args"])
    assert "--trust-request-chat-template" not in text
