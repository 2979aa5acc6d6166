"""The key file's format, and live rotation: keys re-read on change (under load, through a real HTTP
client and a real server) and on SIGHUP; a bad reload keeps the old set; every change audited by key
id, never by key."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time

import httpx
import pytest

from deploy.processes import serving
from service.app import create_app
from service.keys import KEYS_ENV, Keyring, digest, env_items, key_id, load_key_set
from service.scopes import DEFAULT_SCOPES
from tests.service.support import RUN_SUMMARIES

A = "rotation-key-a-0123456789abcd"
B = "rotation-key-b-0123456789abcd"
C = "rotation-key-c-0123456789abcd"
D = "rotation-key-d-0123456789abcd"
BODY = {"state": "Refund me.", "questions": {"q": {"type": "noul", "instructions": "Is it about money?"}}}


def write_keys(path, text: str) -> None:
    """Replace the key file the way operators and Kubernetes do: a new file renamed into place."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def audit_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "opendecide.audit"]


def test_the_key_file_format(tmp_path):
    path = tmp_path / "keys"
    path.write_text(
        f"# ops\n{A}\n{B} tenant=acme\n{C} tenant=acme scopes=decide\n{D} scopes=admin,calibrate tenant=ops\n"
    )
    keys = load_key_set(path, {}).keys
    assert [(k.tenant, sorted(k.scopes), k.bare) for k in keys] == [
        ("default", ["calibrate", "decide"], True),
        (
            "acme",
            ["calibrate", "decide"],
            False,
        ),  # fields without scopes: the default scopes, admin never implied
        ("acme", ["decide"], False),
        ("ops", ["admin", "calibrate"], False),
    ]
    assert "old format" not in load_key_set(path, {}).notice()
    path.write_text(f"{A}\n{B}\n")
    assert "old format (no fields): every key is tenant 'default' with scopes calibrate,decide" in (
        load_key_set(path, {}).notice()
    )


def test_a_tenants_share_is_in_its_keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text(
        f"{A} tenant=acme weight=2.5 tokens_per_minute=60000\n{B} tenant=acme weight=2.5 tokens_per_minute=60000\n{C}\n"
    )
    keys = load_key_set(path, {}).keys
    assert [(k.share.weight, k.share.tokens_per_minute) for k in keys] == [
        (2.5, 60_000),
        (2.5, 60_000),
        (1.0, None),
    ]
    assert keys[0].caller.share == keys[1].caller.share
    assert load_key_set(path, {}).describe()[0] | {"key_id": "…"} == {
        "key_id": "…",
        "tenant": "acme",
        "scopes": ["calibrate", "decide"],
        "weight": 2.5,
        "tokens_per_minute": 60_000,
        "cache_group": None,
    }


@pytest.mark.parametrize(
    "line, message",
    [
        (f"{A} tenant=", "a tenant is 1-64 letters"),
        (f"{A} tenant=a/b", "a tenant is 1-64 letters"),
        (f"{A} scopes=decide,root", "unknown scope(s) ['root']"),
        (f"{A} scopes=", "unknown scope(s) ['']"),
        (
            f"{A} role=admin",
            "after the key come only tenant=, scopes=, weight=, tokens_per_minute=, cache_group=",
        ),
        (f"{A} {B}", "after the key come only tenant="),
        (f"{A} weight=0", "weight is a positive number"),
        (f"{A} weight=heavy", "weight is a positive number"),
        (f"{A} tokens_per_minute=0", "tokens_per_minute a whole number of at least 1"),
        (f"{A} tokens_per_minute=1.5", "tokens_per_minute a whole number of at least 1"),
        (f"{B} tenant=t weight=2\n{A} tenant=t", "tenant 't' has another weight or tokens_per_minute at"),
        (f"{A} tenant=a tenant=b", "tenant given twice"),
        (f"{A}\n{A} tenant=other", "line 3 repeats the key at"),
    ],
)
def test_a_malformed_line_is_refused_by_its_number_never_echoed(tmp_path, line, message):
    path = tmp_path / "keys"
    path.write_text(f"# header\n{line}\n")
    with pytest.raises(ValueError) as raised:
        load_key_set(path, {})
    assert message in str(raised.value) and "line 2" in str(raised.value)
    assert A not in str(raised.value) and B not in str(raised.value)


def test_the_environment_variable_splits_on_semicolons_once_an_item_has_fields():
    assert env_items(f"{A},{B}") == [A, B]  # the old comma list
    assert env_items(f"{A} tenant=x scopes=decide,calibrate; {B}") == [
        f"{A} tenant=x scopes=decide,calibrate",
        B,
    ]
    assert env_items(f"{A};{B}") == [A, B]
    keys = load_key_set(None, {KEYS_ENV: f"{A} tenant=x scopes=admin;{B}"}).keys
    assert [(k.tenant, k.scopes) for k in keys] == [("x", frozenset({"admin"})), ("default", DEFAULT_SCOPES)]
    # Two items of the comma form given fields: ambiguous, refused by item, no key echoed.
    with pytest.raises(
        ValueError, match="item 1: a key holds ','; when any item has fields, separate items with ';'"
    ):
        env_items(f"{A},{B} tenant=x")


def test_a_bad_reload_keeps_the_old_set_and_says_why(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    path = tmp_path / "keys"
    path.write_text(f"{A}\n{B} tenant=b\n")
    ring = Keyring(path, {})
    before = ring.current
    for bad in ("short-key\n", "", f"{A} scopes=everything\n"):
        write_keys(path, bad)
        assert ring.reload("file changed") is False and ring.current is before
    path.unlink()
    assert ring.reload("SIGHUP") is False and ring.current is before
    refused = [line for line in audit_lines(caplog) if line["event"] == "key_set_reload_refused"]
    assert [line["reason"][:40] for line in refused] == [
        f"API key at {path} line 1: a key is 16-2"[:40],
        f"the key file {path} holds no API key"[:40],
        f"API key at {path} line 1: unknown scope("[:40],
        f"[Errno 2] No such file or directory: '{path}'"[:40],
    ]
    assert all(line["keys"] == 2 for line in refused) and "short-key" not in caplog.text


def test_keys_rotate_under_load_without_failing_a_key_that_stays(quick_engine, tmp_path, caplog):
    """Eight clients keep asking with key A through a real server while B is removed, C added, a bad
    file written and D added: A never fails; each change takes within the poll interval."""
    caplog.set_level(logging.INFO, logger="opendecide.audit")
    path = tmp_path / "keys"
    path.write_text(f"{A} tenant=a\n{B} tenant=b\n")
    app = create_app(quick_engine, api_keys=Keyring(path, {}, poll_s=0.05))
    statuses: list[int] = []

    async def run(url: str) -> None:
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def status(key: str) -> int:
                response = await client.post(
                    "/v1/systemone", json=BODY, headers={"authorization": f"Bearer {key}"}
                )
                return response.status_code

            async def keep_asking() -> None:
                while not stop.is_set():
                    statuses.append(await status(A))

            async def until(key: str, wanted: int) -> None:
                deadline = time.monotonic() + 10  # a hang guard, 200 poll intervals: not a speed bound
                while await status(key) != wanted:
                    assert time.monotonic() < deadline, f"rotation not seen: {key[:16]} is not {wanted}"
                    await asyncio.sleep(0.02)

            async def after_requests(count: int) -> None:
                # Counted, not timed: the load is so many requests whatever the machine's speed.
                target = len(statuses) + count
                while len(statuses) < target:
                    await asyncio.sleep(0.01)

            async def refused_seen() -> None:
                deadline = time.monotonic() + 10  # a hang guard, as in until()
                while not any(line["event"] == "key_set_reload_refused" for line in audit_lines(caplog)):
                    assert time.monotonic() < deadline, "the bad key file was not read"
                    await asyncio.sleep(0.02)

            workers = [asyncio.create_task(keep_asking()) for _ in range(8)]
            await after_requests(20)
            assert await status(B) == 200 and await status(C) == 401
            write_keys(path, f"{A} tenant=a\n{C} tenant=c\n")
            await until(C, 200)
            assert await status(B) == 401
            write_keys(path, f"{A} tenant=a\nnot-a-key\n")  # refused: the set in use stays
            await refused_seen()
            await after_requests(20)
            assert await status(C) == 200
            write_keys(path, f"{A} tenant=a\n{C} tenant=c\n{D} tenant=d scopes=decide\n")
            await until(D, 200)
            await after_requests(20)
            stop.set()
            await asyncio.gather(*workers)

    started = time.monotonic()
    with serving(app) as url:
        asyncio.run(run(url))
    RUN_SUMMARIES.append(
        f"key rotation under load: {len(statuses)} requests with the key that stayed over {time.monotonic() - started:.1f} s, "
        f"statuses {sorted(set(statuses))}; 3 swaps taken, 1 bad file kept out"
    )
    assert len(statuses) > 50 and set(statuses) == {200}, (len(statuses), set(statuses))
    events = [(line["event"], line.get("added"), line.get("removed")) for line in audit_lines(caplog)]
    ids = {k: key_id(digest(k)) for k in (A, B, C, D)}
    assert events == [
        ("key_set_changed", [ids[C]], [ids[B]]),
        ("key_set_reload_refused", None, None),
        ("key_set_changed", [ids[D]], []),
    ]
    assert all(k not in caplog.text for k in (A, B, C, D))


@pytest.mark.anyio
async def test_sighup_rereads_the_key_file(quick_engine, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="opendecide.audit")
    path = tmp_path / "keys"
    path.write_text(f"{A}\n")
    ring = Keyring(path, {}, poll_s=3600)  # no poll in this test's time: only the signal can reload
    app = create_app(quick_engine, api_keys=ring)
    async with app.router.lifespan_context(app):
        # the service's handler is installed (else SIGHUP would end this process)
        assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)
        write_keys(path, f"{A}\n{B} tenant=b\n")
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while len(ring.current.keys) != 2:
            assert time.monotonic() < deadline, "SIGHUP did not reload the keys"
            await asyncio.sleep(0.01)
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # and removed on the way out
    (line,) = audit_lines(caplog)
    assert line["trigger"] == "SIGHUP" and line["added"] == [key_id(digest(B))]


def test_a_key_file_edited_in_place_while_read_is_read_again(tmp_path, monkeypatch):
    """An editor writing the file in place: the reload reads it half-written (one key of two), and the
    writer finishes while it reads. Taken as read, B's key would fail until the next poll; the stamp
    taken after the read differs from the one before, so the file is read again, whole."""
    import service.keys

    path = tmp_path / "keys"
    path.write_text(f"{C} tenant=c\n")
    ring = Keyring(path, {}, poll_s=3600)
    path.write_text(f"{A} tenant=a\n")  # in place: the writer's first half
    real_load = service.keys.load_key_set
    reads = []

    def load_while_the_writer_finishes(*args):
        keys = real_load(*args)
        reads.append(len(keys.keys))
        if len(reads) == 1:
            with path.open("a") as file:  # the rest lands while the first read is done with the file
                file.write(f"{B} tenant=b\n")
        return keys

    monkeypatch.setattr(service.keys, "load_key_set", load_while_the_writer_finishes)
    assert ring.reload("file changed") is True
    assert reads == [1, 2] and [k["tenant"] for k in ring.current.describe()] == ["a", "b"]
    assert not ring.changed_on_disk()
