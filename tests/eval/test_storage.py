"""Runs to Cloud Storage and back, on gcp-storage-emulator (real HTTP, the real google-cloud-storage client)."""

from __future__ import annotations

import json

import pytest
import requests
from typer.testing import CliRunner

from eval.evidence.rows import RECORDS
from eval.evidence.storage import (
    TransferRefused,
    download_run,
    run_files,
    storage_client,
    upload_run,
    verify_run,
)
from opendecide.cli import app
from tests.eval.support import copy_run

pytestmark = pytest.mark.integration


class CountingSession(requests.Session):
    """The client's HTTP transport: counts upload requests and, given ``cut_after``, dies on the
    next one, as a process killed mid-upload would (no retry can save it)."""

    def __init__(self, cut_after: int | None = None):
        super().__init__()
        self.uploads, self.cut_after = 0, cut_after

    def request(self, method, url, *args, **kwargs):
        if "/upload/" in url:
            if self.cut_after is not None and self.uploads >= self.cut_after:
                raise Interrupted(f"link cut after {self.uploads} uploads")
            self.uploads += 1
        return super().request(method, url, *args, **kwargs)


class Interrupted(Exception):
    pass


def client_over(emulator: str, session: requests.Session):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": emulator},
        _http=session,
    )


def test_upload_then_download_gives_the_same_files(bucket, tmp_path, tasks_run):
    client, name = bucket
    run = copy_run(tasks_run, tmp_path)
    # past 8 MiB the client sends a file through a resumable upload session rather than one request
    records = (run / RECORDS).read_bytes()  # repeated: gzip members one after another, still its rows
    (run / RECORDS).write_bytes(records * (8 * 2**20 // len(records) + 1))
    assert (run / RECORDS).stat().st_size > 8 * 2**20
    sent = upload_run(run, f"gs://{name}/runs/a", client=client)
    files = run_files(run)
    assert sent.sent == [f["path"] for f in files] and sent.skipped == [] and sent.manifest_written
    names = [blob.name for blob in client.list_blobs(name)]
    assert sorted(names) == sorted([f"runs/a/{f['path']}" for f in files] + ["runs/a/manifest.json"])

    got = download_run(f"gs://{name}/runs/a", tmp_path / "down", client=client)
    assert got.sent == [f["path"] for f in files]
    for f in files:
        assert (tmp_path / "down" / f["path"]).read_bytes() == (run / f["path"]).read_bytes()
    manifest = json.loads((tmp_path / "down" / "manifest.json").read_text())
    original = json.loads((run / "manifest.json").read_text())
    assert {
        k: v for k, v in manifest.items() if k != "files"
    } == original  # the run's manifest, plus the file list
    assert manifest["files"] == files and verify_run(tmp_path / "down") == len(files)
    assert not list((tmp_path / "down").rglob("*.part"))


def test_the_skip_rests_on_the_stored_crc32c(bucket, tmp_path, load_run):
    client, name = bucket
    run = copy_run(load_run, tmp_path)
    upload_run(run, f"gs://{name}/r", client=client)
    # the emulator keeps the CRC32C Cloud Storage would: the value computed here from the file
    stored = {blob.name: blob.crc32c for blob in client.list_blobs(name)}
    assert all(stored[f"r/{f['path']}"] == f["crc32c"] for f in run_files(run))
    again = upload_run(run, f"gs://{name}/r", client=client)
    assert again.sent == [] and not again.manifest_written
    # same size, one byte changed: only that file (and the manifest, whose sha256 changed) go up
    data = bytearray((run / "load.md").read_bytes())
    data[-2] = ord("X") if data[-2] != ord("X") else ord("Y")
    (run / "load.md").write_bytes(bytes(data))
    changed = upload_run(run, f"gs://{name}/r", client=client)
    assert changed.sent == ["load.md"] and changed.manifest_written


def test_an_interrupted_upload_is_incomplete_and_a_rerun_sends_only_what_is_missing(
    emulator, bucket, tmp_path, tasks_run
):
    _, name = bucket
    run = copy_run(tasks_run, tmp_path)
    files = [f["path"] for f in run_files(run)]
    cut = CountingSession(cut_after=4)
    with pytest.raises(Interrupted):
        upload_run(run, f"gs://{name}/half", client=client_over(emulator, cut))
    assert cut.uploads == 4
    # half-uploaded: the files are there, the manifest is not, and a download says so
    with pytest.raises(TransferRefused, match=r"manifest.json is absent: the upload is incomplete"):
        download_run(f"gs://{name}/half", tmp_path / "early", client=storage_client(emulator))

    counting = CountingSession()
    rerun = upload_run(run, f"gs://{name}/half", client=client_over(emulator, counting))
    assert rerun.skipped == files[:4] and rerun.sent == files[4:] and rerun.manifest_written
    assert (
        counting.uploads == len(files) - 4 + 1
    )  # on the wire too: only the missing objects and the manifest
    got = download_run(f"gs://{name}/half", tmp_path / "down", client=storage_client(emulator))
    assert sorted(got.sent) == sorted(files) and verify_run(tmp_path / "down") == len(files)


def test_a_changed_run_removes_the_old_manifest_before_sending_files(emulator, bucket, tmp_path, load_run):
    client, name = bucket
    run = copy_run(load_run, tmp_path)
    upload_run(run, f"gs://{name}/r", client=client)
    (run / "load.jsonl").write_text((run / "load.jsonl").read_text() + "\n")
    with pytest.raises(Interrupted):
        upload_run(run, f"gs://{name}/r", client=client_over(emulator, CountingSession(cut_after=0)))
    # the old manifest would have vouched for a file that has since changed: it is gone, not stale
    with pytest.raises(TransferRefused, match="incomplete"):
        download_run(f"gs://{name}/r", tmp_path / "down", client=client)


def test_download_refuses_a_corrupted_or_missing_object_naming_it(bucket, tmp_path, load_run):
    client, name = bucket
    run = copy_run(load_run, tmp_path)
    upload_run(run, f"gs://{name}/r", client=client)
    # replaced behind the manifest's back (a valid object with other bytes, so only the sha256 can tell)
    client.bucket(name).blob("r/summary.json").upload_from_string(b"[]\n")
    with pytest.raises(TransferRefused, match=r"^summary.json: 3 bytes, the manifest lists \d+"):
        download_run(f"gs://{name}/r", tmp_path / "a", client=client)
    assert not (tmp_path / "a" / "summary.json").exists() and not (tmp_path / "a" / "manifest.json").exists()
    same_size = bytearray((run / "summary.json").read_bytes())
    same_size[10] = ord("#")
    client.bucket(name).blob("r/summary.json").upload_from_string(bytes(same_size))
    with pytest.raises(
        TransferRefused, match=r"^summary.json: sha256 [0-9a-f]{64} does not match the manifest's"
    ):
        download_run(f"gs://{name}/r", tmp_path / "b", client=client)
    client.bucket(name).blob("r/summary.json").delete()
    with pytest.raises(TransferRefused, match=r"^summary.json: listed in the manifest, missing from gs://"):
        download_run(f"gs://{name}/r", tmp_path / "c", client=client)


def test_a_download_resumes_and_refuses_strays(bucket, tmp_path, load_run):
    client, name = bucket
    run = copy_run(load_run, tmp_path)
    upload_run(run, f"gs://{name}/r", client=client)
    down = tmp_path / "down"
    download_run(f"gs://{name}/r", down, client=client)
    (down / "manifest.json").unlink()
    (down / "load.png").unlink()
    again = download_run(f"gs://{name}/r", down, client=client)
    assert again.sent == ["load.png"] and "load.jsonl" in again.skipped and (down / "manifest.json").is_file()
    (down / "load.png.part").write_bytes(b"cut off")  # a download killed mid-file
    assert (
        download_run(f"gs://{name}/r", down, client=client).sent == []
        and not (down / "load.png.part").exists()
    )
    (down / "other.txt").write_text("not this run's")
    with pytest.raises(TransferRefused, match=r"holds files the manifest does not list \(other.txt\)"):
        download_run(f"gs://{name}/r", down, client=client)
    (down / "other.txt").unlink()
    (down / "load.md").write_text("edited after download")
    with pytest.raises(TransferRefused, match="^load.md: "):
        verify_run(down)
    assert verify_run(down, only=["load.jsonl", "summary.json"]) == 2


def test_bad_input_is_named(bucket, tmp_path):
    client, name = bucket
    with pytest.raises(ValueError, match="is not gs://BUCKET"):
        upload_run(tmp_path, "s3://x/y", client=client)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    with pytest.raises(TransferRefused, match="bucket no-such-bucket does not exist"):
        upload_run(tmp_path / "run", "gs://no-such-bucket/x", client=client)
    with pytest.raises(TransferRefused, match="has no manifest.json: not a run directory"):
        upload_run(tmp_path, f"gs://{name}/x", client=client)
    (tmp_path / "manifest.json").write_text('{"kind": "tasks", ')
    with pytest.raises(TransferRefused, match="manifest.json is not JSON"):
        upload_run(tmp_path, f"gs://{name}/x", client=client)
    client.bucket(name).blob("torn/manifest.json").upload_from_string(b'{"files": [')
    with pytest.raises(TransferRefused, match=f"gs://{name}/torn/manifest.json is not JSON"):
        download_run(f"gs://{name}/torn", tmp_path / "d", client=client)
    client.bucket(name).blob("hand/manifest.json").upload_from_string(
        b'{"files": [{"path": "../escape", "bytes": 1, "sha256": "0"}]}'
    )
    with pytest.raises(TransferRefused, match="bad file entry"):
        download_run(f"gs://{name}/hand", tmp_path / "d", client=client)
    client.bucket(name).blob("old/manifest.json").upload_from_string(b'{"kind": "tasks"}')
    with pytest.raises(TransferRefused, match="lists no files: it was not written by decide eval upload"):
        download_run(f"gs://{name}/old", tmp_path / "d", client=client)


def test_upload_and_download_commands(emulator, bucket, tmp_path, load_run):
    _, name = bucket
    run = copy_run(load_run, tmp_path)
    runner = CliRunner()
    up = runner.invoke(app, ["eval", "upload", str(run), f"gs://{name}/cli", "--endpoint", emulator])
    assert up.exit_code == 0, up.output
    assert f"gs://{name}/cli: 4 files sent, 0 already there; manifest.json written last" in up.output
    down = runner.invoke(
        app, ["eval", "download", f"gs://{name}/cli", str(tmp_path / "down"), "--endpoint", emulator]
    )
    assert down.exit_code == 0, down.output
    assert "4 files fetched, 0 already there, all 4 match the manifest's sha256" in down.output
    missing = runner.invoke(
        app, ["eval", "download", f"gs://{name}/nothing", str(tmp_path / "x"), "--endpoint", emulator]
    )
    assert missing.exit_code == 2 and "manifest.json is absent" in missing.output
    bad = runner.invoke(app, ["eval", "upload", str(run), "bucket/prefix", "--endpoint", emulator])
    assert bad.exit_code == 2 and "is not gs://BUCKET" in bad.output


def test_missing_credentials_are_named(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    result = CliRunner().invoke(app, ["eval", "download", "gs://b/p", str(tmp_path / "d")])
    assert result.exit_code == 2 and "no Google credentials" in result.output
