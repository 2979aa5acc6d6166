"""Connection bounds (``service/connections.py``) on a real uvicorn server on loopback: a header timeout,
connections per client address and in all, and the open-file limit (issue 39: 1,100 connections that
never finished their headers exhausted the open files and /healthz got resets)."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from service.app import create_app
from service.connections import ConnectionLimits, connection_cap, raise_open_file_limit, uvicorn_options
from tests.calibration.stores import eventually


@contextlib.contextmanager
def bounded_server(app, limits: ConnectionLimits) -> Iterator[int]:
    """``app`` served within ``limits`` by uvicorn in a thread on a free loopback port; yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", **uvicorn_options(limits))
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.settimeout(20)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    return data


def healthz(port: int, source: str = "127.0.0.1") -> int:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=20) as client:
        return client.get(f"http://127.0.0.1:{port}/healthz").status_code


def answered(port: int) -> bool:
    """/healthz answered 200 (a refused connection may be a 503 or a reset)."""
    try:
        return healthz(port) == 200
    except httpx.TransportError:
        return False


def test_half_sent_headers_are_closed_at_the_header_timeout_while_healthz_answers(quick_engine):
    limits = ConnectionLimits(header_timeout_s=1.0, per_client=0)
    with bounded_server(create_app(quick_engine), limits) as port:
        partial = [connect(port) for _ in range(40)]
        for sock in partial:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        silent = connect(port)  # connects and sends nothing at all
        beside = [healthz(port) for _ in range(5)]
        replies = [read_to_close(sock) for sock in partial]
        nothing = read_to_close(silent)
        after = healthz(port)
    assert beside == [200] * 5 and after == 200
    for reply in replies:
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head, reply
        detail = json.loads(body)["detail"]
        assert detail["error_type"] == "request_timeout" and "1 s" in detail["message"]
    assert nothing == b""  # closed without a word: no request had begun


def test_the_header_timeout_restarts_after_each_response(quick_engine):
    """A kept-alive connection answers a request, then times out waiting for the next one's headers."""
    with bounded_server(create_app(quick_engine), ConnectionLimits(header_timeout_s=0.5)) as port:
        sock = connect(port)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        first = sock.recv(65536)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        rest = read_to_close(sock)
    assert first.startswith(b"HTTP/1.1 200")
    assert rest.startswith(b"HTTP/1.1 408")


def test_connections_per_client_address_are_bounded(quick_engine):
    """A fourth connection from 127.0.0.1 gets 503 at once; 127.0.0.2 is still served, and a freed
    connection lets 127.0.0.1 in again."""
    limits = ConnectionLimits(header_timeout_s=60, per_client=3)
    with bounded_server(create_app(quick_engine), limits) as port:
        held = [connect(port) for _ in range(3)]
        refused = read_to_close(connect(port))
        other_address = healthz(port, source="127.0.0.2")
        held.pop().close()
        eventually(lambda: answered(port))
        for sock in held:
            sock.close()
    head, _, body = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head, refused
    detail = json.loads(body)["detail"]
    assert (
        detail["error_type"] == "overloaded_error" and "3 connections from one address" in detail["message"]
    )
    assert other_address == 200


def test_connections_in_all_are_bounded(quick_engine):
    with bounded_server(create_app(quick_engine), ConnectionLimits(header_timeout_s=60, total=2)) as port:
        held = [connect(port, "127.0.0.1"), connect(port, "127.0.0.2")]
        refused = read_to_close(connect(port, "127.0.0.3"))
        for sock in held:
            sock.close()
    assert refused.startswith(b"HTTP/1.1 503") and b"2 connections" in refused


def test_the_soft_open_file_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
    try:
        raised = raise_open_file_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard) and raised == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connections_in_all_stay_below_the_open_file_limit():
    assert connection_cap(ConnectionLimits(total=4096), 1024).total == 1024 - 256
    assert connection_cap(ConnectionLimits(total=100), 1024).total == 100


@pytest.mark.parametrize(
    "options",
    [{"header_timeout_s": 0}, {"per_client": -1}, {"total": 0}],
    ids=["timeout", "per-client", "total"],
)
def test_limits_out_of_range_are_refused(options):
    with pytest.raises(ValueError):
        ConnectionLimits(**options)
