"""A key file that cannot be mistaken: one format (a line that is not a key is an error by its
number), an empty file refused, a BOM stripped, only regular files read (a FIFO never blocks the
service), ``cache_group=`` per tenant; and no key in a query string or a log line."""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest

from service.keys import KEYS_ENV, Keyring, digest, load_key_set
from service.server import ServeOptions, ServeRefused, open_keyring

A = "file-key-a-0123456789abcdef"
B = "file-key-b-0123456789abcdef"
ADMIN = "file-key-admin-0123456789ab"
BODY = {"state": "Refund me.", "questions": {"q": {"type": "noul", "instructions": "Is it about money?"}}}


def refused(path) -> str:
    with pytest.raises(ValueError) as raised:
        load_key_set(path, {})
    return str(raised.value)


@pytest.mark.parametrize(
    "line",
    [
        "DATABASE_URL=postgres://app:hunter2-hunter2@db/app",  # a swapped-in .env: never a key
        "export OPENAI_API_KEY=sk-0123456789abcdef0123",
        '"quoted-key-0123456789abcdef"',
        "clé-avec-accent-0123456789abc",  # not ASCII
        "tenant=acme scopes=decide",  # fields without their key
    ],
)
def test_a_line_that_is_not_a_key_is_refused_by_number_never_taken(tmp_path, line):
    path = tmp_path / "keys"
    path.write_text(f"{A} tenant=a\n# a comment\n{line}\n", encoding="utf-8")
    message = refused(path)
    assert f"{path} line 3" in message and "letters, digits" in message
    assert line.split()[0] not in message and "hunter2" not in message and A not in message


@pytest.mark.parametrize("text", ["", "\n\n", "# keys go here\n\n  # none yet\n"])
def test_an_empty_key_file_is_refused(tmp_path, text):
    path = tmp_path / "keys"
    path.write_text(text)
    assert f"{path} holds no API key" in refused(path)
    # decide serve refuses it on loopback too (auth would be off, and keys added later never read)
    with pytest.raises(ServeRefused, match="holds no API key") as raised:
        open_keyring(ServeOptions(api_key_file=path), {})
    assert raised.value.option == "--api-key-file"
    # unless auth is off on purpose
    assert open_keyring(ServeOptions(api_key_file=path, no_auth=True), {}) is None


def test_a_reload_that_finds_the_file_empty_keeps_the_old_set_and_logs_why(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="opendecide.auth")
    path = tmp_path / "keys"
    path.write_text(f"{A}\n")
    ring = Keyring(path, {})
    before = ring.current
    path.write_text("# every key commented out\n# " + A + "\n")
    assert ring.reload("SIGHUP") is False and ring.current is before
    (record,) = [r for r in caplog.records if r.name == "opendecide.auth"]
    assert "holds no API key" in record.getMessage() and "keeping the 1 key(s)" in record.getMessage()
    assert A not in caplog.text


def test_a_byte_order_mark_is_stripped(tmp_path):
    path = tmp_path / "keys"
    path.write_bytes(b"\xef\xbb\xbf" + f"{A} tenant=a\n{B} tenant=b\n".encode())
    keys = load_key_set(path, {}).keys
    assert [k.digest for k in keys] == [digest(A), digest(B)] and keys[0].tenant == "a"


def load_in_thread(path) -> tuple[threading.Thread, list]:
    outcome: list = []

    def load() -> None:
        try:
            outcome.append(load_key_set(path, {}))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=5)
    return thread, outcome


def test_a_fifo_in_place_of_the_key_file_is_refused_without_blocking(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="opendecide.auth")
    path = tmp_path / "keys"
    path.write_text(f"{A}\n")
    ring = Keyring(path, {}, poll_s=3600)
    path.unlink()
    os.mkfifo(path)
    thread, outcome = load_in_thread(path)
    if thread.is_alive():  # blocked opening the FIFO: a writer's open lets it go before failing
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(timeout=5)
        pytest.fail("reading the key file blocked on a FIFO")
    assert isinstance(outcome[0], ValueError) and "not a regular file" in str(outcome[0])
    assert ring.reload("file changed") is False and ring.current.match(A) is not None
    assert "not a regular file" in caplog.text


def test_a_directory_or_a_device_is_refused(tmp_path):
    assert "not a regular file" in refused(tmp_path)
    assert "not a regular file" in refused("/dev/null")
    with pytest.raises(ServeRefused, match="not a regular file"):
        open_keyring(ServeOptions(api_key_file=tmp_path), {})


def test_a_tenants_cache_group_is_in_its_keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{A} tenant=acme cache_group=shared-1\n{B} tenant=acme cache_group=shared-1\n{ADMIN}\n")
    keys = load_key_set(path, {}).keys
    assert [k.caller.cache_group for k in keys] == ["shared-1", "shared-1", None]
    assert keys[0].caller.cache_salt == "group:shared-1" and keys[2].caller.cache_salt == "tenant:default"
    assert [k["cache_group"] for k in load_key_set(path, {}).describe()] == ["shared-1", "shared-1", None]


@pytest.mark.parametrize(
    "lines, message",
    [
        (f"{A} tenant=acme cache_group=g1\n{B} tenant=acme", "tenant 'acme' has another cache_group at"),
        (f"{A} tenant=acme cache_group=g1\n{B} tenant=acme cache_group=g2", "another cache_group"),
        (f"{A}\n{B} cache_group=a/b", "a cache_group is 1-64 letters"),
        (f"{A}\n{B} cache_group=", "a cache_group is 1-64 letters"),
    ],
)
def test_a_tenant_with_two_cache_groups_is_refused_by_line(tmp_path, lines, message):
    path = tmp_path / "keys"
    path.write_text(lines + "\n")
    text = refused(path)
    assert message in text and f"{path} line 2" in text and B not in text


@pytest.mark.anyio
async def test_the_key_listing_shows_the_cache_group(client_factory, quick_engine, tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{A} tenant=acme cache_group=shared-1\n{ADMIN} tenant=ops scopes=admin\n")
    async with client_factory(quick_engine, api_keys=Keyring(path, {})) as client:
        listing = await client.get("/v1/keys", headers={"authorization": f"Bearer {ADMIN}"})
    assert listing.status_code == 200
    assert [k["cache_group"] for k in listing.json()["keys"]] == ["shared-1", None]


@pytest.mark.anyio
@pytest.mark.parametrize("param", ["api_key", "key", "API_KEY"])
async def test_a_key_in_the_query_string_is_refused_and_never_logged(
    client_factory, quick_engine, caplog, param
):
    caplog.set_level(logging.DEBUG)
    async with client_factory(quick_engine, api_keys=[A]) as client:
        response = await client.post(f"/v1/systemone?{param}={A}", json=BODY)
        with_header = await client.get(f"/v1/models?{param}={A}", headers={"authorization": f"Bearer {A}"})
        probe = await client.get(f"/healthz?{param}={A}")
    for answer in (response, with_header, probe):
        assert answer.status_code == 400, answer.text
        detail = answer.json()["detail"]
        assert detail["param"] == param and "Authorization: Bearer" in detail["message"]
        assert A not in answer.text
    # The service's lines (the client's own log of the URL it called is the client's business)
    assert not [r for r in caplog.records if not r.name.startswith("httpx") and A in r.getMessage()]


def test_the_uvicorn_access_log_redacts_key_like_query_values(caplog):
    """uvicorn's own access line prints the path with its query: key-like values are redacted."""
    from service.keys import redact_access_log

    caplog.set_level(logging.INFO, logger="uvicorn.access")
    access = logging.getLogger("uvicorn.access")
    redact_access_log()
    redact_access_log()  # once is enough; twice adds nothing
    try:
        # the call uvicorn's httptools and h11 protocols make
        access.info(
            '%s - "%s %s HTTP/%s" %d',
            "127.0.0.1:5000", "GET", f"/v1/models?x=1&api_key={A}&Token={B}&key=", "1.1", 400,
        )  # fmt: skip
    finally:
        for found in [f for f in access.filters if type(f).__name__ == "RedactKeys"]:
            access.removeFilter(found)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert A not in line and B not in line
    assert "/v1/models?x=1&api_key=[redacted]&Token=[redacted]&key=" in line


def test_keys_from_the_environment_with_an_empty_file_are_still_refused(tmp_path):
    path = tmp_path / "keys"
    path.write_text("")
    with pytest.raises(ServeRefused, match="holds no API key"):
        open_keyring(ServeOptions(api_key_file=path), {KEYS_ENV: A})
    ring = open_keyring(ServeOptions(), {KEYS_ENV: A})
    assert ring is not None and ring.path is None and json.dumps(ring.current.describe())
