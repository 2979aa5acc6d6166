"""Run directories to and from Cloud Storage (``decide eval upload`` / ``decide eval download``).

Under ``gs://BUCKET/PREFIX/`` each file of the run sits at its path in the run directory, and
``manifest.json`` is written **last**: the run's own manifest plus ``files``, one
``{path, bytes, sha256, crc32c}`` per file. A prefix without ``manifest.json`` is an upload that has
not finished (or never started), and a download refuses it.

Upload is resumable by object. The objects already under the prefix are listed once; a file whose
object has the same size and CRC32C (Cloud Storage computes it on write and keeps it in the object's
metadata) is skipped, so a rerun after an interruption sends only what is missing or changed. An
older ``manifest.json`` that differs from the one this upload writes is deleted before any file is
sent, so the prefix reads as incomplete while its files change. Objects under the prefix that the
manifest does not list are left alone and never downloaded.

Download fetches every listed file, checks its size and sha256 against the manifest, and refuses,
naming the file, on a missing object or a mismatch; it writes ``manifest.json`` last as well. Files
already in the directory with the listed sha256 are kept, so a download resumes too.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from opendecide.extras import needs_extra

if TYPE_CHECKING:
    from google.cloud.storage import Client

MANIFEST = "manifest.json"
CHUNK = 1 << 20


class TransferRefused(RuntimeError):
    """A run that cannot be uploaded, or a prefix or directory that does not match its manifest."""


@dataclass
class Transfer:
    """What one upload or download did: files sent (or fetched), files skipped as already there,
    and whether the manifest was written (an upload whose run had not changed leaves it)."""

    url: str
    sent: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    manifest_written: bool = False


def storage_client(endpoint: str | None = None, project: str | None = None) -> Client:
    """A Cloud Storage client: Google's endpoint with application-default credentials, or
    ``endpoint`` (an emulator, say) with anonymous ones."""
    with needs_extra("gcs", "Cloud Storage transfers"):
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage

    if endpoint is None:
        try:
            return storage.Client(project=project)
        except DefaultCredentialsError:
            raise TransferRefused(
                "no Google credentials: run `gcloud auth application-default login` (or give --endpoint)"
            ) from None
    from google.auth.credentials import AnonymousCredentials

    return storage.Client(
        project=project or "anonymous",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


def parse_url(url: str) -> tuple[str, str]:
    """``gs://BUCKET[/PREFIX]`` → (bucket, prefix without slashes at either end)."""
    if not url.startswith("gs://") or not url[5:].split("/", 1)[0]:
        raise ValueError(f"{url!r} is not gs://BUCKET[/PREFIX]")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def file_entry(path: Path, relative: str) -> dict:
    """Size, sha256 and CRC32C (base64 of the big-endian value, as Cloud Storage reports it) of one file."""
    sha, crc, size = hashlib.sha256(), crc32c_checksum(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
            crc.update(chunk)
            size += len(chunk)
    return {
        "path": relative,
        "bytes": size,
        "sha256": sha.hexdigest(),
        "crc32c": base64.b64encode(crc.digest()).decode("ascii"),
    }


def run_files(run: Path) -> list[dict]:
    """Every file of the run directory but its top-level manifest, sorted by path."""
    paths = sorted(p for p in run.rglob("*") if p.is_file() and p != run / MANIFEST)
    return [file_entry(p, p.relative_to(run).as_posix()) for p in paths]


def upload_run(run: Path, url: str, *, client: Client) -> Transfer:
    """Upload ``run`` to ``url``, skipping objects already there with the same size and CRC32C; the
    manifest, with the file list, goes last."""
    bucket_name, prefix = parse_url(url)
    if not (run / MANIFEST).is_file():
        raise TransferRefused(f"{run} has no {MANIFEST}: not a run directory")
    manifest = read_json(run / MANIFEST)
    files = run_files(run)
    body = (json.dumps({**manifest, "files": files}, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    from google.api_core.exceptions import NotFound

    bucket = client.bucket(bucket_name)
    try:
        existing = {
            blob.name: blob for blob in client.list_blobs(bucket, prefix=f"{prefix}/" if prefix else None)
        }
    except NotFound:
        raise TransferRefused(f"bucket {bucket_name} does not exist") from None
    manifest_key = _key(prefix, MANIFEST)
    transfer = Transfer(url)
    old = existing.get(manifest_key)
    unchanged = old is not None and _same(old, len(body), crc32c_of(body))
    if old is not None and not unchanged:
        bucket.blob(manifest_key).delete()  # the prefix reads as incomplete until the new manifest lands
    for entry in files:
        key = _key(prefix, entry["path"])
        if (blob := existing.get(key)) is not None and _same(blob, entry["bytes"], entry["crc32c"]):
            transfer.skipped.append(entry["path"])
            continue
        bucket.blob(key).upload_from_filename(str(run / entry["path"]), checksum="crc32c")
        transfer.sent.append(entry["path"])
    if not unchanged:
        bucket.blob(manifest_key).upload_from_string(body, content_type="application/json", checksum="crc32c")
        transfer.manifest_written = True
    return transfer


def download_run(url: str, dest: Path, *, client: Client) -> Transfer:
    """Download the run at ``url`` into ``dest``, verifying every file against the manifest's sha256."""
    from google.api_core.exceptions import NotFound

    bucket_name, prefix = parse_url(url)
    bucket = client.bucket(bucket_name)
    try:
        body = bucket.blob(_key(prefix, MANIFEST)).download_as_bytes()
    except NotFound:
        raise TransferRefused(
            f"{url.rstrip('/')}/{MANIFEST} is absent: the upload is incomplete (rerun decide eval upload) or nothing was uploaded there"
        ) from None
    where = f"{url.rstrip('/')}/{MANIFEST}"
    try:
        files = listed_files(json.loads(body), where)
    except json.JSONDecodeError as error:
        raise TransferRefused(f"{where} is not JSON ({error})") from None
    dest.mkdir(parents=True, exist_ok=True)
    # a .part file is a download cut off here before: it is fetched again
    listed = {entry["path"] + suffix for entry in files for suffix in ("", ".part")} | {MANIFEST}
    if strays := sorted(
        p.relative_to(dest).as_posix()
        for p in dest.rglob("*")
        if p.is_file() and p.relative_to(dest).as_posix() not in listed
    ):
        raise TransferRefused(
            f"{dest} holds files the manifest does not list ({', '.join(strays[:3])}): download into an empty directory"
        )
    transfer = Transfer(url)
    for entry in files:
        local = dest / entry["path"]
        part = local.with_name(local.name + ".part")
        if local.is_file() and _mismatch(local, entry) is None:
            part.unlink(missing_ok=True)
            transfer.skipped.append(entry["path"])
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            bucket.blob(_key(prefix, entry["path"])).download_to_filename(str(part))
        except NotFound:
            part.unlink(missing_ok=True)
            raise TransferRefused(f"{entry['path']}: listed in the manifest, missing from {url}") from None
        if why := _mismatch(part, entry):
            part.unlink()
            raise TransferRefused(f"{entry['path']}: {why}")
        part.replace(local)
        transfer.sent.append(entry["path"])
    (dest / MANIFEST).write_bytes(body)
    transfer.manifest_written = True
    return transfer


def verify_run(run: Path, only: Collection[str] | None = None) -> int:
    """Check a run directory against the file list in its manifest (one written by ``upload_run``),
    or only the listed files among ``only``; returns the number of files checked, 0 when the
    manifest lists none. Raises TransferRefused naming the first file missing or changed."""
    manifest = read_json(run / MANIFEST)
    if "files" not in manifest:
        return 0
    files = [e for e in listed_files(manifest, str(run / MANIFEST)) if only is None or e["path"] in only]
    for entry in files:
        if not (run / entry["path"]).is_file():
            raise TransferRefused(f"{entry['path']}: listed in {run / MANIFEST}, missing from {run}")
        if why := _mismatch(run / entry["path"], entry):
            raise TransferRefused(f"{entry['path']}: {why}")
    return len(files)


def read_json(path: Path) -> dict:
    """A run manifest, refused by name when it is not a JSON object."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise TransferRefused(f"{path} is not JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise TransferRefused(f"{path} is not a JSON object")
    return manifest


def listed_files(manifest: object, where: str) -> list[dict]:
    """The manifest's file list, each path checked to stay inside the run directory."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list):
        raise TransferRefused(f"{where} lists no files: it was not written by decide eval upload")
    for entry in files:
        path = PurePosixPath(str(entry.get("path", "")) if isinstance(entry, dict) else "")
        if (
            not isinstance(entry, dict)
            or path.is_absolute()
            or ".." in path.parts
            or str(path) in ("", ".", MANIFEST)
        ):
            raise TransferRefused(f"{where}: bad file entry {entry!r}")
        if not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int):
            raise TransferRefused(f"{where}: {path} has no sha256 and bytes")
    return files


def crc32c_checksum(data: bytes = b""):
    """A running CRC32C (google-crc32c, the gcs extra), imported here rather than with the module so that
    commands which only name this module's errors (``decide eval cost``) need no extra."""
    with needs_extra("gcs", "Cloud Storage transfers"):
        import google_crc32c

    return google_crc32c.Checksum(data)


def crc32c_of(data: bytes) -> str:
    """CRC32C of bytes in memory, in Cloud Storage's form."""
    return base64.b64encode(crc32c_checksum(data).digest()).decode("ascii")


def _mismatch(path: Path, entry: dict) -> str | None:
    local = file_entry(path, entry["path"])
    if local["bytes"] != entry["bytes"]:
        return f"{local['bytes']} bytes, the manifest lists {entry['bytes']}"
    if local["sha256"] != entry["sha256"]:
        return f"sha256 {local['sha256']} does not match the manifest's {entry['sha256']}"
    return None


def _same(blob, size: int, crc32c: str) -> bool:
    return blob.size == size and blob.crc32c == crc32c


def _key(prefix: str, path: str) -> str:
    return f"{prefix}/{path}" if prefix else path
