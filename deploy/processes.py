"""Local servers: a free loopback port, waiting until a server answers ``/v1/models``, an ASGI app
served on a real loopback socket from a thread (tests and benchmarks), and a reaper that leaves no
orphans when a server dies.

Both vLLM and the decision service are ready when ``GET /v1/models`` answers 200 (vLLM's ``/health``
answers before the model can serve). Used by ``decide engine start``, the tests and the benchmarks.

The reaper (``reaped_command``, run as ``python -m deploy.processes -- COMMAND…``) is the leader of
the server's session and runs the server as its child. vLLM's API server starts its engine core and
workers as processes of its own, which outlive it when it is killed (SIGKILL, the OOM killer) and keep
~3 GB. Two real mechanisms close that, one per side:

- the server dies: the reaper, waiting on it, ends every other process of the session (SIGTERM, then
  SIGKILL after a grace period) and exits with the server's status;
- the reaper dies: the kernel sends the server SIGTERM (``PR_SET_PDEATHSIG``, set in the child before
  it runs the server), which vLLM answers by shutting its engine core and workers down.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
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


def session_members(sid: int) -> list[int]:
    """PIDs of the live processes in session ``sid`` (from /proc; field 6 of ``stat``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session …
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


REAP_GRACE_S = 10.0
"""How long the rest of a dead server's session gets to exit on SIGTERM before SIGKILL."""
PR_SET_PDEATHSIG = 1


def reaped_command(command: list[str]) -> list[str]:
    """``command`` run under the reaper (module docstring); start it in a new session."""
    return [sys.executable, "-m", "deploy.processes", "--", *command]


def _die_with_parent(parent: int) -> None:
    # Runs in the child between fork and exec: the kernel signals it when the reaper thread that
    # forked it dies. If the reaper died already (before prctl took effect), go now.
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def run_reaped(command: list[str], *, grace_s: float = REAP_GRACE_S) -> int:
    """Run ``command`` as a child that dies with this process; when it exits, end every other process
    of this session; return its exit status (128 + N when signal N ended it, as a shell says)."""
    me = os.getpid()
    child = subprocess.Popen(command, preexec_fn=lambda: _die_with_parent(me))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # ``stop`` signals the leader: pass it on
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    status = child.wait()
    rest = [pid for pid in session_members(os.getsid(0)) if pid != me]
    signal_all(rest, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (
        rest := [pid for pid in session_members(os.getsid(0)) if pid != me]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_all(rest, signal.SIGKILL)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if not arguments or arguments[0] != "--" or len(arguments) < 2:
        sys.exit("usage: python -m deploy.processes -- COMMAND [ARG…]")
    sys.exit(run_reaped(arguments[1:]))
