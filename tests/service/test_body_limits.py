"""Bodies are bounded per route before they are read, and large ones are decoded and parsed off the event
loop (issue 39: a 14 MB feedback body stalled /healthz for seconds)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading

import httpx
import pytest

from calibration.open import open_store
from deploy.processes import serving
from service import parse
from service.app import create_app
from service.keys import Keyring
from service.middleware import decompress
from service.middleware.decompress import INLINE_BODY_BYTES, ROUTE_BODY_LIMITS

pytestmark = pytest.mark.anyio

NOUL = {"type": "noul", "instructions": "Is it positive?"}


def large_decision() -> bytes:
    """A decision body over the inline size that is cheap to answer: its bulk is JSON whitespace."""
    body = json.dumps({"state": "a fine day", "questions": {"q": NOUL}}).encode()
    return body[:-1] + b" " * (INLINE_BODY_BYTES + 1) + b"}"


class BlockedParses:
    """``service.parse._check_values`` held until released, noting the thread each parse ran in."""

    def __init__(self, monkeypatch, entries: int = 1) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []
        self.released: list[bool] = []
        check = parse._check_values

        def held(payload):
            self.threads.append(threading.current_thread())
            self.entered.release()
            # Bounded, so a parse on the event loop fails the test instead of hanging it.
            self.released.append(self.release.wait(timeout=20))
            check(payload)

        monkeypatch.setattr(parse, "_check_values", held)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.acquire, timeout=20), "no parse started"


def test_a_14_mb_feedback_body_is_refused_at_its_content_length(quick_engine, tmp_path, monkeypatch):
    """Headers that promise 14 MB to /v1/feedback, and no body: the 413 comes without a byte of it."""
    parsed = []
    monkeypatch.setattr(parse, "parse_body", lambda *args: parsed.append(args))
    store = open_store(tmp_path / "calibration.sqlite3")
    with serving(create_app(quick_engine, store=store)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(
                b"POST /v1/feedback HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: 14000000\r\n\r\n"
            )
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        health = httpx.get(f"{url}/healthz", timeout=20)
    store.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    detail = json.loads(body)["detail"]
    assert (
        detail["error_type"] == "body_too_large"
        and detail["limit"] == 65536 == ROUTE_BODY_LIMITS["/v1/feedback"]
    )
    assert "65536 bytes" in detail["message"] and "/v1/feedback" in detail["message"]
    assert parsed == [] and health.status_code == 200


async def test_route_limits_apply_to_bytes_read_and_are_configurable(client_factory, quick_engine, tmp_path):
    """A chunked body (no Content-Length) is refused once its bytes pass the route's limit; a path the
    limits do not name keeps the default."""
    store = open_store(tmp_path / "calibration.sqlite3")
    feedback = json.dumps({"decision_id": "nope", "gold": True}).encode()

    async def chunked(data: bytes):
        for start in range(0, len(data), 10):
            yield data[start : start + 10]

    limits = {"/v1/feedback": len(feedback)}
    async with client_factory(quick_engine, store=store, body_limits=limits, max_body_bytes=200) as client:
        fits = await client.post(
            "/v1/feedback", content=feedback, headers={"content-type": "application/json"}
        )
        over = await client.post(
            "/v1/feedback", content=chunked(feedback + b" "), headers={"content-type": "application/json"}
        )
        trailing_slash = await client.post(
            "/v1/feedback/", content=feedback + b" ", headers={"content-type": "application/json"}
        )
        refit = await client.post(
            "/v1/calibrations/refit", content=b" " * 201, headers={"content-type": "application/json"}
        )
    store.close()
    assert fits.status_code == 404, fits.text  # read and parsed: no such decision
    assert over.status_code == 413 and over.json()["detail"]["limit"] == len(feedback)
    assert trailing_slash.status_code == 413 and trailing_slash.json()["detail"]["limit"] == len(feedback)
    assert refit.status_code == 413 and refit.json()["detail"]["limit"] == 200
    assert "on /v1" not in refit.json()["detail"]["message"]  # the default names no route


async def test_a_large_decision_body_is_parsed_off_the_event_loop(client_factory, quick_engine, monkeypatch):
    blocked = BlockedParses(monkeypatch)
    async with client_factory(quick_engine) as client:
        posting = asyncio.create_task(
            client.post(
                "/v1/systemone", content=large_decision(), headers={"content-type": "application/json"}
            )
        )
        await blocked.wait_entered()
        health = await client.get("/healthz")  # answered while the parse is held in its thread
        blocked.release.set()
        response = await posting
    assert health.status_code == 200
    assert response.status_code == 200, response.text
    assert blocked.released == [True] and blocked.threads[0] is not threading.main_thread()


async def test_large_parses_are_bounded_per_route_and_per_tenant(
    client_factory, quick_engine, monkeypatch, tmp_path
):
    """Two large parses at once on a route, one of them a tenant's: tenant a's second large body is
    529 while tenant b's still finds the other slot, and a third tenant's is 529 at the route bound."""
    blocked = BlockedParses(monkeypatch)
    keys = tmp_path / "keys"
    keys.write_text("".join(f"tenant-{t}-key-0123456789 tenant={t}\n" for t in "abc"))
    body = large_decision()

    def post(tenant: str, content: bytes = body):
        headers = {
            "content-type": "application/json",
            "authorization": f"Bearer tenant-{tenant}-key-0123456789",
        }
        return client.post("/v1/systemone", content=content, headers=headers)

    async with client_factory(quick_engine, api_keys=Keyring(keys, {})) as client:
        held = [asyncio.create_task(post("a"))]
        await blocked.wait_entered()
        a_again = await post("a")
        held.append(asyncio.create_task(post("b")))
        await blocked.wait_entered()
        c_refused = await post("c")
        small = await post("a", json.dumps({"state": "s", "questions": {"q": NOUL}}).encode())
        blocked.release.set()
        answered = await asyncio.gather(*held)
    for refused in (a_again, c_refused):
        assert refused.status_code == 529 and refused.headers["retry-after"] == "1"
        assert refused.json()["detail"]["error_type"] == "overloaded_error"
    assert "this tenant's" in a_again.json()["detail"]["message"]
    assert "this tenant's" not in c_refused.json()["detail"]["message"]
    assert small.status_code == 200  # small bodies are parsed on the loop, outside the bound
    assert [r.status_code for r in answered] == [200, 200]


async def test_a_body_that_decodes_large_is_decoded_in_a_worker_thread(
    client_factory, quick_engine, monkeypatch
):
    """A small gzip body whose output passes the inline size is decoded again in a thread, which the
    event loop does not wait on."""
    entered, release, threads = threading.Event(), threading.Event(), []
    decode = decompress._decode

    def held(raw, encoding, limit):
        if limit > INLINE_BODY_BYTES:  # the worker thread's pass, not the inline attempt
            threads.append(threading.current_thread())
            entered.set()
            release.wait(timeout=20)
        return decode(raw, encoding, limit)

    monkeypatch.setattr(decompress, "_decode", held)
    raw = gzip.compress(large_decision())
    assert len(raw) < INLINE_BODY_BYTES
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    async with client_factory(quick_engine) as client:
        posting = asyncio.create_task(client.post("/v1/systemone", content=raw, headers=headers))
        assert await asyncio.to_thread(entered.wait, 20)
        health = await client.get("/healthz")
        release.set()
        response = await posting
    assert health.status_code == 200 and response.status_code == 200, response.text
    assert threads and threads[0] is not threading.main_thread()
