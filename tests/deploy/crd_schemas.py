"""The published CRD schemas the gateway manifests are validated against, shipped as test data.

``tests/fixtures/crds/`` holds each CRD file byte for byte as its project tagged it, with the project's
LICENSE beside it and ``MANIFEST.json`` naming repository, tag, commit, upstream path and sha256 (the way
eval/data records its datasets). ``crd_validator`` checks the sha256 before it trusts a file.

Validation is strict, as ``kubectl apply --validate=strict`` is: a CRD's structural schema lets the API
server prune unknown fields silently, so every object schema that lists ``properties`` (and neither
allows extra properties nor sets ``x-kubernetes-preserve-unknown-fields``) is closed here, and a
misspelt field fails instead of vanishing. Not evaluated: the CEL rules (``x-kubernetes-validations``),
which need a CEL interpreter; the tests assert the fields those rules cover where the fleet depends on them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"


def shipped_files() -> dict[Path, str]:
    """Every shipped CRD file and LICENSE → the sha256 MANIFEST.json records for it."""
    manifest = json.loads((CRDS / "MANIFEST.json").read_text())
    files = {}
    for folder, source in manifest["sources"].items():
        files[CRDS / folder / "LICENSE"] = source["licence_sha256"]
        for name, row in source["files"].items():
            files[CRDS / folder / name] = row["sha256"]
    return files


def closed(schema: dict) -> dict:
    """``schema`` with every object that lists its properties closed to others (see the module docstring)."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: closed(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = closed(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            schema[key] = [closed(sub) for sub in schema[key]]
    return schema


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) → a strict validator, for every served version of every shipped CRD.

    AssertionError if a file's sha256 is not the one MANIFEST.json records."""
    validators = {}
    for path, sha256 in shipped_files().items():
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256, f"{path} is not the file MANIFEST.json records"
        if path.name == "LICENSE":
            continue
        crd = yaml.safe_load(data)
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                api_version = f"{crd['spec']['group']}/{version['name']}"
                schema = closed(version["schema"]["openAPIV3Schema"])
                validators[(api_version, crd["spec"]["names"]["kind"])] = jsonschema.Draft7Validator(schema)
    return validators


def validate_custom(doc: dict) -> None:
    """Validate one object against its shipped CRD schema; KeyError if none is shipped for it,
    ``jsonschema.ValidationError`` (the first error) if it does not conform."""
    validator = crd_validators()[(doc["apiVersion"], doc["kind"])]
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        raise error
