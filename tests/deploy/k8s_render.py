"""What the GKE manifest tests share (a plain module): ``kubectl kustomize`` renders of deploy/k8s, the
pinned Kubernetes version they validate against, and lookups into rendered objects."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import yaml

from tests.tools import require_tool

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.32"
NAMESPACE = "opendecide"

TPU_IMAGE = "vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507"

SERVICE_COMMAND = [
    "decide", "serve", "--host", "0.0.0.0", "--port", "8080", "--engine", "vllm",
    "--engine-url", "dns+http://vllm-engine-headless:8000",
    "--engine-image", "$(ENGINE_IMAGE)", "--service-image", "$(SERVICE_IMAGE)",
    "--api-key-file", "/var/run/opendecide/api-keys", "--metrics-port", "9090",
]  # fmt: skip
PINNED = re.compile(r"^[a-z0-9][a-z0-9._/-]*@sha256:[0-9a-f]{64}$")


@functools.cache
def render(target: str) -> tuple[dict, ...]:
    """``kubectl kustomize`` of a folder under deploy/k8s, as parsed objects."""
    command = [require_tool("kubectl"), "kustomize", str(K8S / target)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {target} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(docs, kind: str, name: str) -> dict:
    """The one object of this kind whose name is ``name`` (ConfigMaps carry a hash suffix)."""
    named = re.compile(rf"{name}(-[a-z0-9]{{10}})?")
    hits = [d for d in docs if d["kind"] == kind and named.fullmatch(d["metadata"]["name"])]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {[d['metadata']['name'] for d in hits]}"
    return hits[0]


def container(deployment: dict, name: str) -> dict:
    (hit,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return hit


def selects(match_labels: dict, deployment: dict) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


def flag_values(args: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (a flag followed by another flag has no value)."""
    flags: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else None
            flags[arg] = None if following is None or following.startswith("--") else following
    return flags


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}
