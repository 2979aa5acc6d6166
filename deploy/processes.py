"""Local servers: a free loopback port, waiting until a server answers ``/v1/models``, and an ASGI app
served on a real loopback socket from a thread (tests and benchmarks).

Both vLLM and the decision service are ready when ``GET /v1/models`` answers 200 (vLLM's ``/health``
answers before the model can serve). Used by ``decide engine start``, the tests and the benchmarks.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    """A loopback port free right now (the OS picks it; another process could still take it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_models(
    url: str,
    *,
    process: subprocess.Popen | None = None,
    log: Path | None = None,
    timeout_s: float = 120.0,
    path: str = "/v1/models",
) -> None:
    """Return once ``url`` + ``path`` answers 200 (``/readyz`` for a decision service that wants a key).

    Raises ``RuntimeError`` (with the log's tail) if ``process`` exits first, ``TimeoutError`` after
    ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(
                f"{process.args[0] if process.args else 'server'} exited with {process.returncode} before serving; log tail:\n{tail}"
            )
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"{url}{path} did not answer within {timeout_s:.0f} s" + (f"; see {log}" if log else "")
    )


@contextlib.contextmanager
def serving(app, *, timeout_s: float = 30.0) -> Iterator[str]:
    """``app`` on a real uvicorn server on a free loopback port, in a thread; yields its URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
