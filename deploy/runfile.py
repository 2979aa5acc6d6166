"""The run file of ``decide deploy``: one TOML file naming the target, the models, the engine flags,
an optional eval and the bucket. ``load_run`` reads and checks it; every error names its field.

Defaults per target are the settings of the public single-chip study (xbill9/gemma4-dev, jev-tpu*,
2026-09): v6e as a ``ct6e-standard-1t`` Compute Engine instance in europe-west4-a with a 200 GB boot
disk, v5e as a flex-start queued resource in us-west4-a, ``--max-run-duration 4h`` and two hours in
the queue, vLLM with ``--max-num-seqs 16 --max-logprobs 32``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The TPU image the study's runs resolved ``vllm/vllm-tpu:nightly`` to (issue 12).
TPU_ENGINE_IMAGE = "vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507"

# AWS's public SSM parameter for the latest Ubuntu 22.04 Deep Learning Base AMI with the NVIDIA driver,
# Docker and the NVIDIA container toolkit; EC2 resolves it at launch.
AWS_DLAMI = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)

TARGETS = ("v6e", "v5e", "l4-gcp", "l4-aws")
PROVISIONING = {
    "v6e": ("on-demand", "flex-start"),
    "v5e": ("flex-start",),
    "l4-gcp": ("on-demand", "spot"),
    "l4-aws": ("on-demand",),
}
DEFAULT_ZONE = {"v6e": "europe-west4-a", "v5e": "us-west4-a", "l4-gcp": "us-central1-a"}
EVAL_RUNS = ("tasks", "suite", "load")
GENERATE_TASKS = ("gsm8k", "bfcl_simple")
# The example run files' service image: a digest of zeros stands for "build and push yours first"
# (docs/deploy.md). Dry runs render it; a real deploy refuses it.
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64

_DIGEST_REF = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
# GCE, TPU and queued-resource names: lowercase letter first, then letters, digits, hyphens.
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,48}[a-z0-9])?$")
_DURATION = re.compile(r"^(\d+d)?(\d+h)?(\d+m)?(\d+s)?$")
_MODALITIES = ("image", "audio", "video")
MAX_IMAGES = 128  # images one decision request carries at most (service/protocol/image_parts.py)
# What an arm measures (``[[model]] measure``): ``read`` the [eval] run, ``load`` `decide eval load`,
# ``generation`` the [generate] tasks.
MEASURES = ("read", "load", "generation")
# ``[[model]] repack``: `decide repack` on the machine (deploy/repack.py), format → its arguments.
REPACKS = {"q4": ("q4",), "w8a8": ("w8a8",), "w8a8-emb4": ("w8a8", "--emb4")}


class RunFileError(ValueError):
    """A run file field is missing or wrong; ``field`` is its dotted name."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Model:
    """One checkpoint to serve, in order."""

    id: str
    max_model_len: int
    modalities: tuple[str, ...] = ()  # input modalities besides text; each is limited to 0 per prompt
    images: int = 0  # images a decision may carry, read by the model (startup.serve_flags); 0: none
    extra_flags: tuple[str, ...] = ()
    name: str | None = None  # the arm's name: its folder and served name (default: from the id)
    repack: str | None = None  # a REPACKS format built on the machine from the checkpoint ``id``
    build: str | None = None  # a repacked build's gs:// or s3:// folder, copied onto the machine
    measure: tuple[str, ...] | None = None  # MEASURES; None: whatever the run file configures
    gpu_memory_utilization: float | None = None

    @property
    def tag(self) -> str:
        """The model's folder name in the run directory."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.name or self.id)

    @property
    def served(self) -> str:
        """The name vLLM serves it under: the arm's name, or the checkpoint id."""
        return self.name or self.id

    @property
    def prepared(self) -> bool:
        """Whether the engine loads a build prepared on the machine (repacked or copied in)."""
        return self.repack is not None or self.build is not None


@dataclass(frozen=True)
class Eval:
    run: str  # tasks | suite | load: the eval command, and the run its manifest names
    data: str | None = None  # suite only: gs:// or s3:// folder copied onto the machine
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generate:
    """The generation arms (``[generate]``): ``decide eval generate`` per task, then, with
    ``throughput``, ``decide eval throughput``, against each model."""

    gen: tuple[str, ...]  # gsm8k | bfcl_simple
    tool_call_parser: str | None = None  # vLLM's --tool-call-parser; bfcl_simple needs one
    max_tokens: int = 2048
    limit: int | None = None  # a seeded subset (seed 0); None: every problem
    throughput: bool = False


@dataclass(frozen=True)
class Aws:
    region: str
    instance_profile: str  # an IAM instance profile allowed to read the secret and write the bucket
    image_id: str
    key_name: str | None = None
    security_group_ids: tuple[str, ...] = ()
    subnet_id: str | None = None


@dataclass(frozen=True)
class Run:
    """A checked run file: everything the command builders and the startup script need."""

    name: str
    target: str
    provisioning: str
    bucket: str
    engine_image: str
    service_image: str
    models: tuple[Model, ...]
    project: str | None = None
    zone: str | None = None
    max_run_duration: str = "4h"
    valid_until_duration: str = "2h"
    hf_secret: str = "hf-token"
    max_num_seqs: int = 16
    max_logprobs: int = 32
    engine_flags: tuple[str, ...] = ()
    service_flags: tuple[str, ...] = ()
    eval: Eval | None = None
    aws: Aws | None = None
    generate: Generate | None = None
    patches: str | None = None  # a bucket folder with the TPU patches plugin's wheel, installed in the engine

    @property
    def platform(self) -> str:
        return "aws" if self.target == "l4-aws" else "gcp"

    @property
    def accelerator(self) -> str:
        return "gpu" if self.target.startswith("l4") else "tpu"

    @property
    def max_run_seconds(self) -> int:
        return duration_seconds(self.max_run_duration)


def duration_seconds(text: str) -> int:
    """``4h``, ``90m``, ``1d2h`` → seconds (the duration format gcloud takes)."""
    match = _DURATION.match(text)
    if not text or not match:
        raise ValueError(f"not a duration like 4h or 90m: {text!r}")
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(part[:-1]) * units[part[-1]] for part in match.groups() if part)


def load_run(path: str | Path) -> Run:
    """Read and check a run file; raises ``RunFileError`` naming the first bad field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise RunFileError(str(path), f"not valid TOML: {error}") from None
    return parse_run(data)


def parse_run(data: dict[str, Any]) -> Run:
    """Check a run file's parsed TOML (see ``load_run``)."""
    fields = _Fields(data, "")
    target = fields.choice("target", TARGETS)
    name = fields.text("name")
    if not _NAME.match(name):
        raise RunFileError(
            "name",
            "lowercase letters, digits and hyphens, a letter first, at most 50 characters "
            f"(it names the VM or queued resource), got {name!r}",
        )
    provisioning = fields.choice("provisioning", PROVISIONING[target], default=PROVISIONING[target][0])
    bucket = fields.text("bucket").rstrip("/")
    scheme = "s3://" if target == "l4-aws" else "gs://"
    if not bucket.startswith(scheme) or len(bucket) <= len(scheme):
        raise RunFileError("bucket", f"a {scheme}BUCKET[/PREFIX] URL for target {target}, got {bucket!r}")

    default_engine = TPU_ENGINE_IMAGE if target in ("v6e", "v5e") else None
    engine_image = fields.digest_ref("engine_image", default=default_engine)
    service_image = fields.digest_ref("service_image")

    project = zone = None
    aws = None
    if target == "l4-aws":
        aws = _parse_aws(_Fields(fields.table("aws"), "aws"))
    else:
        project = fields.text("project")
        zone = fields.text("zone", default=DEFAULT_ZONE[target])

    max_run = fields.duration("max_run_duration", default="4h")
    if target != "v5e" and "valid_until_duration" in data:
        raise RunFileError(
            "valid_until_duration", "only for target v5e (how long a flex-start request may queue)"
        )
    valid_until = fields.duration("valid_until_duration", default="2h")

    engine = _Fields(fields.table("engine", default={}), "engine")
    max_model_len = engine.integer("max_model_len", default=2048)
    max_num_seqs = engine.integer("max_num_seqs", default=16)
    max_logprobs = engine.integer("max_logprobs", default=32)
    engine_flags = engine.strings("extra_flags", default=[])
    engine.done()

    service = _Fields(fields.table("service", default={}), "service")
    service_flags = service.strings("extra_flags", default=[])
    service.done()

    raw_models = data.get("model")
    if not isinstance(raw_models, list) or not raw_models:
        raise RunFileError("model", "give at least one [[model]] table with an id")
    models = tuple(
        _parse_model(_Fields(m, f"model[{i}]"), max_model_len, scheme) for i, m in enumerate(raw_models)
    )
    if len({m.tag for m in models}) != len(models):
        raise RunFileError("model", "each model may be served once per run")
    fields.seen.add("model")

    evaluation = None
    if "eval" in data:
        evaluation = _parse_eval(_Fields(fields.table("eval"), "eval"), scheme)

    generate = None
    if "generate" in data:
        generate = _parse_generate(_Fields(fields.table("generate"), "generate"))

    for i, model in enumerate(models):
        for measure in model.measure or ():
            if measure == "read" and evaluation is None:
                raise RunFileError(f"model[{i}].measure", "read needs an [eval] table")
            if measure == "generation" and generate is None:
                raise RunFileError(f"model[{i}].measure", "generation needs a [generate] table")

    patches = fields.text("patches", default=None)
    if patches is not None and (not patches.startswith(scheme) or target not in ("v5e", "v6e")):
        raise RunFileError(
            "patches",
            f"a {scheme} folder holding the opendecide_tpu_patches wheel (patches/README.md), TPU targets only",
        )
    hf_secret = fields.text("hf_secret", default="hf-token")
    fields.done()
    return Run(
        name=name,
        target=target,
        provisioning=provisioning,
        bucket=bucket,
        engine_image=engine_image,
        service_image=service_image,
        models=models,
        project=project,
        zone=zone,
        max_run_duration=max_run,
        valid_until_duration=valid_until,
        hf_secret=hf_secret,
        max_num_seqs=max_num_seqs,
        max_logprobs=max_logprobs,
        engine_flags=engine_flags,
        service_flags=service_flags,
        eval=evaluation,
        aws=aws,
        generate=generate,
        patches=patches,
    )


def _parse_model(fields: _Fields, max_model_len: int, scheme: str) -> Model:
    name = fields.text("name", default=None)
    if name is not None and not _NAME.match(name):
        raise RunFileError(f"{fields.prefix}.name", f"lowercase letters, digits and hyphens, got {name!r}")
    repack = fields.text("repack", default=None)
    if repack is not None and repack not in REPACKS:
        raise RunFileError(f"{fields.prefix}.repack", f"one of {', '.join(REPACKS)}, got {repack!r}")
    build = fields.text("build", default=None)
    if build is not None and not build.startswith(scheme):
        raise RunFileError(
            f"{fields.prefix}.build", f"a {scheme} folder holding a repacked build, got {build!r}"
        )
    if repack is not None and build is not None:
        raise RunFileError(f"{fields.prefix}.build", "either repack on the machine or copy a build, not both")
    if (repack or build) and name is None:
        raise RunFileError(
            f"{fields.prefix}.name", "a repacked arm needs a name (its folder and served name)"
        )
    measure = fields.strings("measure", default=None) if "measure" in fields.data else None
    for item in measure or ():
        if item not in MEASURES:
            raise RunFileError(f"{fields.prefix}.measure", f"each one of {', '.join(MEASURES)}, got {item!r}")
    utilisation = fields._get("gpu_memory_utilization", None, float, "a number in (0, 1]")
    if utilisation is not None and not 0 < utilisation <= 1:
        raise RunFileError(
            f"{fields.prefix}.gpu_memory_utilization", f"a number in (0, 1], got {utilisation!r}"
        )
    model = Model(
        id=fields.text("id"),
        max_model_len=fields.integer("max_model_len", default=max_model_len),
        modalities=fields.strings("modalities", default=[]),
        images=fields.integer("images") if "images" in fields.data else 0,
        extra_flags=fields.strings("extra_flags", default=[]),
        name=name,
        repack=repack,
        build=build,
        measure=measure,
        gpu_memory_utilization=utilisation,
    )
    for modality in model.modalities:
        if modality not in _MODALITIES:
            raise RunFileError(
                f"{fields.prefix}.modalities", f"each one of {', '.join(_MODALITIES)}, got {modality!r}"
            )
    if model.images > MAX_IMAGES:
        raise RunFileError(
            f"{fields.prefix}.images", f"at most {MAX_IMAGES} (a request's limit), got {model.images}"
        )
    if model.images and any("ForCausalLM" in flag for flag in model.extra_flags):
        # --hf-overrides '{"architectures": ["Gemma4ForCausalLM"]}' loads the text tower alone.
        raise RunFileError(
            f"{fields.prefix}.images",
            "a model that reads images needs its multimodal architecture: drop the ForCausalLM override",
        )
    fields.done()
    return model


def _parse_eval(fields: _Fields, scheme: str) -> Eval:
    run = fields.choice("run", EVAL_RUNS)
    data = fields.text("data", default=None) if run == "suite" else None
    if run == "suite" and (data is None or not data.startswith(scheme)):
        raise RunFileError(
            "eval.data", f"the suite folder as a {scheme} URL (copied onto the machine), got {data!r}"
        )
    evaluation = Eval(run=run, data=data, args=fields.strings("args", default=[]))
    fields.done()
    return evaluation


def _parse_generate(fields: _Fields) -> Generate:
    gen = fields.strings("gen")
    for task in gen:
        if task not in GENERATE_TASKS:
            raise RunFileError("generate.gen", f"each one of {', '.join(GENERATE_TASKS)}, got {task!r}")
    if not gen:
        raise RunFileError("generate.gen", f"at least one of {', '.join(GENERATE_TASKS)}")
    parser = fields.text("tool_call_parser", default=None)
    if "bfcl_simple" in gen and parser is None:
        # Without a parser vLLM refuses tool requests, and `decide eval generate` refuses the task.
        raise RunFileError(
            "generate.tool_call_parser", "bfcl_simple needs vLLM's tool-call parser for the model"
        )
    limit = fields.integer("limit") if "limit" in fields.data else None
    generate = Generate(
        gen=gen,
        tool_call_parser=parser,
        max_tokens=fields.integer("max_tokens", default=2048),
        limit=limit,
        throughput=fields._get("throughput", False, bool, "true or false"),
    )
    fields.done()
    return generate


def _parse_aws(fields: _Fields) -> Aws:
    aws = Aws(
        region=fields.text("region"),
        instance_profile=fields.text("instance_profile"),
        image_id=fields.text("image_id", default=AWS_DLAMI),
        key_name=fields.text("key_name", default=None),
        security_group_ids=fields.strings("security_group_ids", default=[]),
        subnet_id=fields.text("subnet_id", default=None),
    )
    fields.done()
    return aws


class _Fields:
    """Typed reads of one TOML table, remembering which keys were read so unknown ones are refused."""

    def __init__(self, data: Any, prefix: str):
        if not isinstance(data, dict):
            raise RunFileError(prefix, f"a table, got {type(data).__name__}")
        self.data, self.prefix, self.seen = data, prefix, set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    _MISSING = object()

    def _get(self, key: str, default: Any, expected: type | tuple[type, ...], what: str) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is self._MISSING:
                raise RunFileError(self._name(key), "required")
            return default
        value = self.data[key]
        if not isinstance(value, expected) or isinstance(value, bool) and expected is int:
            raise RunFileError(self._name(key), f"{what}, got {value!r}")
        return value

    def text(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default, str, "a string")
        if value is not None and not value.strip():
            raise RunFileError(self._name(key), "must not be empty")
        return value

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self._get(key, default, int, "a positive integer")
        if value <= 0:
            raise RunFileError(self._name(key), f"a positive integer, got {value!r}")
        return value

    def strings(self, key: str, default: Any = _MISSING) -> tuple[str, ...]:
        value = self._get(key, default, list, "a list of strings")
        if not all(isinstance(item, str) for item in value):
            raise RunFileError(self._name(key), f"a list of strings, got {value!r}")
        return tuple(value)

    def table(self, key: str, default: Any = _MISSING) -> dict:
        return self._get(key, default, dict, "a table")

    def choice(self, key: str, options: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.text(key, default)
        if value not in options:
            raise RunFileError(self._name(key), f"one of {', '.join(options)}, got {value!r}")
        return value

    def duration(self, key: str, default: Any = _MISSING) -> str:
        value = self.text(key, default)
        try:
            duration_seconds(value)
        except ValueError as error:
            raise RunFileError(self._name(key), str(error)) from None
        return value

    def digest_ref(self, key: str, default: Any = _MISSING) -> str:
        if default is None:  # no default image for this target: the field is required
            default = self._MISSING
        value = self.text(key, default)
        if not _DIGEST_REF.match(value):
            raise RunFileError(
                self._name(key), f"an image reference pinned by digest (NAME@sha256:<64 hex>), got {value!r}"
            )
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise RunFileError(self._name(unknown[0]), "unknown field")
