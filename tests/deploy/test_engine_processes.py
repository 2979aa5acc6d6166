"""``decide engine start|stop`` leave no orphan processes: the whole session goes, after a crash too,
and a server that dies takes its engine processes with it without any ``decide engine`` call (the
reaper, ``deploy/processes.py``).

A stand-in ``vllm.entrypoints.openai.api_server`` module (put first on PYTHONPATH) is started through
the real ``start``: it serves ``/v1/models`` and, like vLLM, starts a worker process that outlives it
when it is killed. Real processes, real signals, real /proc.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from deploy.processes import free_port
from deploy.vllm_cpu import ServerSpec, session_members, start, state_file, status, stop

pytestmark = pytest.mark.integration  # real server and worker processes

API_SERVER = textwrap.dedent(
    """
    import http.server, json, subprocess, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the engine worker
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "stand-in", "worker": worker.pid}]}).encode()
            self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> ServerSpec:
    package = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(API_SERVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("OPENDECIDE_CACHE", str(tmp_path / "cache"))
    return ServerSpec(model_dir=str(tmp_path), served_name="stand-in", port=free_port())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def start_stand_in(spec: ServerSpec, tmp_path: Path):
    server = start(spec, python=Path(sys.executable), log=tmp_path / "server.log", timeout_s=30)
    members = session_members(server.pid)
    assert server.pid in members and len(members) >= 2, members  # the server and its worker
    return server, members


def test_stop_ends_the_whole_session(stand_in, tmp_path):
    server, members = start_stand_in(stand_in, tmp_path)
    assert stop(stand_in.port) == server
    assert not any(alive(pid) for pid in members) and not state_file(stand_in.port).exists()


def test_stop_after_the_server_crashed_ends_its_orphans(stand_in, tmp_path):
    server, members = start_stand_in(stand_in, tmp_path)
    os.kill(server.pid, signal.SIGKILL)  # the API server dies; its worker lives on
    deadline = time.monotonic() + 10
    while alive(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphans = [pid for pid in members if pid != server.pid and alive(pid)]
    assert orphans and status(stand_in.port) is None
    assert stop(stand_in.port) == server
    assert not any(alive(pid) for pid in orphans)


def test_start_clears_a_crashed_runs_orphans_first(stand_in, tmp_path):
    crashed, members = start_stand_in(stand_in, tmp_path)
    os.kill(crashed.pid, signal.SIGKILL)
    time.sleep(0.5)
    orphans = [pid for pid in members if pid != crashed.pid and alive(pid)]
    assert orphans
    server, _ = start_stand_in(stand_in, tmp_path)
    try:
        assert not any(alive(pid) for pid in orphans)
    finally:
        stop(stand_in.port)
    assert not session_members(server.pid)


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_gone(pids: list[int], timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(pid) for pid in pids)


def test_a_killed_server_takes_its_engine_processes_with_it(stand_in, tmp_path):
    """The probe: SIGKILL to the API server left ~3 GB of engine processes until the next
    ``decide engine`` call. Now its reaper ends them at once."""
    reaper, members = start_stand_in(stand_in, tmp_path)
    (api_server,) = children(reaper.pid)
    worker = next(pid for pid in members if pid not in (reaper.pid, api_server))
    os.kill(api_server, signal.SIGKILL)
    assert wait_gone([api_server, worker, reaper.pid]), session_members(reaper.pid)
    assert not session_members(reaper.pid) and status(stand_in.port) is None
    stop(stand_in.port)  # only the state file is left to clear


def test_a_killed_reaper_takes_the_server_with_it(stand_in, tmp_path):
    """SIGKILL to the session leader: the kernel sends the API server SIGTERM (PR_SET_PDEATHSIG)."""
    reaper, members = start_stand_in(stand_in, tmp_path)
    (api_server,) = children(reaper.pid)
    os.kill(reaper.pid, signal.SIGKILL)
    assert wait_gone([reaper.pid, api_server])
    stop(stand_in.port)
    assert not any(alive(pid) for pid in members)
