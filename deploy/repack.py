"""Repack a quantization-aware-trained (QAT) checkpoint into compressed-tensors builds vLLM loads,
without rounding its weights again (``decide repack q4 | w8a8``): the build folder and its manifest.

The ideas live beside this module: the source folder and the rule per architecture of which tensors
are quantized (``deploy/repack_source.py``), each group's 4-bit grid recovered from the QAT values and
the int8 channels (``deploy/repack_grid.py``), and the compressed-tensors formats, ``q4`` (W4A16) and
``w8a8`` (W8A8, ``--emb4``), their tensors and config block (``deploy/repack_format.py``). The QAT-like
test fixture is ``deploy/repack_fixture.py``.

Memory: tensors are read one at a time through ``safe_open`` (memory-mapped) and each output shard is
written when its input shard is done, so the peak is one shard's output plus one tensor's work
(rows are processed in chunks of ``CHUNK_ROWS``; an expert bank one expert at a time). The output
goes to a temporary folder beside the destination and is renamed at the end: an interrupted repack
leaves no folder a server would load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.repack_format import COMPRESSED_TENSORS_VERSION, FORMATS, compressed, quantization_config
from deploy.repack_grid import Report
from deploy.repack_source import SOURCE_MANIFEST, RepackError, Source, expert_matrices, read_source, role
from opendecide.extras import needs_extra

with needs_extra("local", "repacking a model"):
    import torch

# The file digest the embedded model's preparation uses, read in 1 MiB blocks.
from readers.embedded import _sha256

MANIFEST = "opendecide-repack.json"
# Files copied as they are (tokenizer, chat template, generation defaults, notices)
COPIED = re.compile(
    r"(tokenizer.*|special_tokens_map\.json|.*\.jinja|generation_config\.json|chat_template\.json|"
    r"preprocessor_config\.json|processor_config\.json|NOTICE|LICENSE.*|README\.md|.*\.model|vocab\..*|merges\.txt)"
)


def refuse_existing(dst: Path, force: bool) -> None:
    """A destination that exists is replaced only when asked (``--force``)."""
    if dst.exists() and not force:
        raise RepackError(f"{dst}: exists (--force replaces it)")


@contextmanager
def staged(dst: Path) -> Iterator[Path]:
    """A temporary folder beside ``dst`` to write into, renamed to ``dst`` (replacing it: ``--force``,
    checked by ``refuse_existing``) when the block ends, and removed if it raises: a server never
    finds a half-written folder at ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    try:
        yield staging
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(staging, dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_served_manifest(source: Source, staging: Path, label: str, revision: str, **fields) -> None:
    """The source's model manifest, if it has one, into ``staging`` under a name and revision of its
    own (``<name>-<label>``, ``<revision>:<source revision>``): what is served from the folder is not
    the source model."""
    path = source.folder / SOURCE_MANIFEST
    if not path.is_file():
        return
    served = json.loads(path.read_text())
    served["name"] = f"{served.get('name', source.folder.name)}-{label}"
    served["revision"] = f"{revision}:{served.get('revision', '')}"
    served.update(fields)
    (staging / SOURCE_MANIFEST).write_text(json.dumps(served, indent=2) + "\n")


def _source_revision(source: Source) -> str:
    manifest = source.folder / SOURCE_MANIFEST
    if manifest.is_file():
        revision = json.loads(manifest.read_text()).get("revision")
        if revision:
            return revision
    for key in ("_commit_hash", "_name_or_path"):
        if source.config.get(key):
            return str(source.config[key])
    return "unknown (no revision in the source folder)"


def _tied(config: dict) -> bool:
    """Whether the output head is the embedding (transformers' default for a missing field: tied)."""
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))


def _module(name: str) -> str:
    return name[: -len(".weight")]


def _write_shards(
    fmt: str,
    source: Source,
    staging: Path,
    *,
    emb4: bool,
    lm_head: bool,
    allow_rounding: bool,
    report: Report,
) -> dict[str, str]:
    """Each source shard's build written to ``staging`` under the shard's name before the next is read;
    returns the weight map (tensor → shard file)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    weight_map: dict[str, str] = {}
    for shard in source.shards:
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(shard, framework="pt") as reader:
            for name in reader.keys():
                bank = reader.get_slice(name)
                kind = role(name, tuple(bank.get_shape()), source.rule, emb4=emb4, lm_head=lm_head)
                if kind == "experts":
                    # One expert at a time (a 26B bank is 1 GB of bf16): the slice reads only
                    # that expert's rows from the memory-mapped shard.
                    for module, label, matrix in expert_matrices(name, bank, source.rule):
                        tensors |= compressed(
                            fmt, "linear", module, matrix, f"{shard.name}: {label}", allow_rounding, report
                        )
                        report.expert_matrices += 1
                    report.quantized += 1
                    continue
                tensor = reader.get_tensor(name)
                if kind == "kept":
                    tensors[name] = tensor
                    report.kept += 1
                    report.kept_names.append(name)
                    continue
                tensors |= compressed(
                    fmt, kind, _module(name), tensor, f"{shard.name}: {name}", allow_rounding, report
                )
                report.quantized += 1
                del tensor
        save_file(tensors, staging / shard.name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard.name))
        del tensors
    return weight_map


def _manifest(
    fmt: str,
    build: str,
    source: Source,
    staging: Path,
    config: dict,
    *,
    emb4: bool,
    lm_head: bool,
    report: Report,
) -> dict:
    """``opendecide-repack.json``: the build, its rule and counts, and the checksums of the source and
    of every file already in ``staging``."""
    return {
        "build": build,
        "format": config["quantization_config"]["format"],
        "compressed_tensors": COMPRESSED_TENSORS_VERSION,
        "source": str(source.folder),
        "source_revision": _source_revision(source),
        "rule": {
            "model_type": source.config.get("model_type"),
            "quantized": list(source.rule.linear)
            + (["lm_head"] if lm_head else [])
            + (["embed_tokens (int4)"] if emb4 else []),
            "kept_by_path": list(source.rule.kept),
            "expert_banks": {bank: list(split) for bank, split in source.rule.experts},
            "why": source.rule.why,
        },
        "tensors": {
            "quantized": report.quantized,
            "kept": report.kept,
            "expert_matrices": report.expert_matrices,
        },
        "groups": report.groups,
        "groups_rounded": report.groups_rounded,
        "max_rounding_error": report.max_rounding_error,
        "q4_0_reexport": {
            "values": report.q4_0_values,
            "changed": report.q4_0_changed,
            "max_change": report.q4_0_max_change,
        },
        "int8_max_error": report.int8_max_error if fmt == "w8a8" else None,
        "source_sha256": {p.name: _sha256(p) for p in source.shards + (source.folder / "config.json",)},
        "sha256": {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()},
    }


def repack(
    fmt: str,
    src: Path,
    dst: Path,
    *,
    emb4: bool = False,
    lm_head: bool = False,
    allow_rounding: bool = False,
    force: bool = False,
) -> dict:
    """Write the ``fmt`` build of ``src`` to ``dst``; returns the manifest written there."""
    if fmt not in FORMATS:
        raise RepackError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    if emb4 and fmt != "w8a8":
        raise RepackError("--emb4 belongs to w8a8 (q4 builds keep the embedding as the source has it)")
    dst = Path(dst)
    refuse_existing(dst, force)
    source = read_source(Path(src))
    if lm_head and _tied(source.config):
        raise RepackError(
            f"{source.folder / 'config.json'}: lm_head is tied to the embedding (--lm-head needs an untied head)"
        )
    report = Report()
    with staged(dst) as staging:
        weight_map = _write_shards(
            fmt, source, staging, emb4=emb4, lm_head=lm_head, allow_rounding=allow_rounding, report=report
        )
        if len(source.shards) > 1:
            index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
            (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        config = dict(source.config)
        config["quantization_config"] = quantization_config(fmt, source.rule, emb4=emb4, lm_head=lm_head)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for path in sorted(source.folder.iterdir()):
            if path.is_file() and COPIED.fullmatch(path.name):
                shutil.copy2(path, staging / path.name)
        build = fmt + ("-emb4" if emb4 else "") + ("-lmhead" if lm_head else "")
        write_served_manifest(source, staging, build, f"repack-{build}")
        manifest = _manifest(fmt, build, source, staging, config, emb4=emb4, lm_head=lm_head, report=report)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
