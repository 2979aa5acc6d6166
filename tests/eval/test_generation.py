"""``decide eval generate`` against a fake OpenAI-compatible server (httpx.MockTransport, no sockets)."""

from __future__ import annotations

import json

import httpx
import pytest

from eval.evidence.manifest import RunRefused
from eval.evidence.rows import load_rows
from eval.generation.datasets import load_dataset
from eval.generation.run import ChatServer, ServerRefused, run_generation
from eval.generation.score import gsm8k_gold

pytestmark = pytest.mark.anyio

GOLD = {
    problem.messages[0]["content"]: gsm8k_gold(problem.gold) for problem in load_dataset("gsm8k").problems
}


class FakeServer:
    """Answers GSM8K with the gold number (``wrong`` questions with gold + 1, ``long`` ones cut at
    the cap), fails ``failing`` questions with a 500 while they are listed, and calls BFCL functions
    with the first possible answer when ``parser`` is on."""

    def __init__(self, *, parser: bool = True, shows_tools: bool = True) -> None:
        self.parser, self.shows_tools = parser, shows_tools
        self.wrong: set[str] = set()
        self.long: set[str] = set()
        self.failing: set[str] = set()
        self.garbled: set[str] = set()
        self.requests: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(
                200, json={"data": [{"id": "fake-model", "root": "/models/fake", "max_model_len": 8192}]}
            )
        if path == "/version":
            return httpx.Response(200, json={"version": "0.0-test"})
        body = json.loads(request.content)
        if path == "/tokenize":
            count = 10 + (5 if body.get("tools") and self.shows_tools else 0)
            return httpx.Response(200, json={"count": count, "tokens": []})
        self.requests.append(body)
        if body.get("tools") and not self.parser:
            return httpx.Response(
                400, json={"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}}
            )
        if body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            return self.reply(
                "", tool_calls=[{"type": "function", "function": {"name": name, "arguments": "{}"}}]
            )
        question = body["messages"][-1]["content"]
        if question in self.failing:
            return httpx.Response(500, text="engine died")
        if question in self.garbled:
            return httpx.Response(200, text="<html>proxy error</html>")
        gold = GOLD[question]
        if question in self.long:
            return self.reply(f"Let me think step by step about {gold}", finish_reason="length")
        answer = str(int(gold) + 1) if question in self.wrong else gold
        return self.reply(f"So the answer is ${answer}.")

    @staticmethod
    def reply(content: str, *, finish_reason: str = "stop", tool_calls: list | None = None) -> httpx.Response:
        message = {"role": "assistant", "content": content, "tool_calls": tool_calls or []}
        return httpx.Response(
            200,
            json={
                "choices": [{"message": message, "finish_reason": finish_reason}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 9},
            },
        )


def server_for(fake: FakeServer) -> ChatServer:
    return ChatServer("http://fake", transport=httpx.MockTransport(fake))


def questions(limit: int, seed: int = 3) -> list[str]:
    from eval.generation.datasets import subset

    return [p.messages[0]["content"] for p in subset(load_dataset("gsm8k").problems, limit, seed)]


async def test_gsm8k_run_counts_right_wrong_truncated_and_errors(tmp_path):
    fake = FakeServer()
    asked = questions(6)
    fake.wrong, fake.long, fake.failing, fake.garbled = {asked[0]}, {asked[1]}, {asked[2]}, {asked[3]}
    manifest = await run_generation(server_for(fake), "gsm8k", tmp_path, limit=6, seed=3, concurrency=2)
    assert manifest["summary"] == {
        "records": 6, "scored": 4, "correct": 2, "wrong": 1, "truncated": 1, "errors": 2, "accuracy": 0.5,
    }  # fmt: skip
    assert manifest["status"] == "incomplete"
    request = fake.requests[0]
    assert request["temperature"] == 0 and request["max_tokens"] == 2048
    assert request["chat_template_kwargs"] == {"enable_thinking": False} and request["model"] == "fake-model"
    assert manifest["server"]["server_version"] == "0.0-test" and manifest["data_sha256"]
    rows = {row["id"]: row for row in load_rows(tmp_path)}
    errors = {row["id"]: row["error"]["type"] for row in rows.values() if row["status"] == "error"}
    assert sorted(errors.values()) == ["bad_reply", "http_500"]

    # Resumed: only the failed records are asked again, and they are scored now.
    fake.failing, fake.garbled, fake.requests = set(), set(), []
    manifest = await run_generation(server_for(fake), "gsm8k", tmp_path, limit=6, seed=3, concurrency=2)
    assert sorted(r["messages"][-1]["content"] for r in fake.requests) == sorted(asked[2:4])
    assert manifest["summary"]["errors"] == 0 and manifest["summary"]["correct"] == 4
    assert manifest["status"] == "success"


class Killed(Exception):
    pass


async def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    fake = FakeServer()
    calls = 0

    def dies_after_three(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        if request.url.path == "/v1/chat/completions":
            calls += 1
            if calls > 3:
                raise Killed  # the process stops mid-run
        return fake(request)

    with pytest.raises(Killed):
        await run_generation(
            ChatServer("http://fake", transport=httpx.MockTransport(dies_after_three)),
            "gsm8k",
            tmp_path,
            limit=8,
            concurrency=1,
        )
    fake.requests = []
    manifest = await run_generation(server_for(fake), "gsm8k", tmp_path, limit=8, concurrency=1)
    assert len(fake.requests) == 5 and manifest["summary"]["correct"] == 8


async def test_another_setting_is_refused_in_the_same_directory(tmp_path):
    await run_generation(server_for(FakeServer()), "gsm8k", tmp_path, limit=2)
    with pytest.raises(RunRefused, match="max_tokens"):
        await run_generation(server_for(FakeServer()), "gsm8k", tmp_path, limit=2, max_tokens=256)


async def test_bfcl_refuses_a_server_without_tool_call_parsing(tmp_path):
    with pytest.raises(ServerRefused, match="does not parse tool calls"):
        await run_generation(server_for(FakeServer(parser=False)), "bfcl_simple", tmp_path, limit=2)
    assert not (tmp_path / "records.jsonl.gz").exists()


async def test_bfcl_refuses_a_template_that_hides_the_tool_unless_told(tmp_path):
    fake = FakeServer(shows_tools=False)
    with pytest.raises(ServerRefused, match="--tools-in-prompt"):
        await run_generation(server_for(fake), "bfcl_simple", tmp_path, limit=2)
    fake.requests = []
    manifest = await run_generation(server_for(fake), "bfcl_simple", tmp_path, limit=2, tools_in_prompt=True)
    assert manifest["tools_shown_by"] == "system message"
    system = fake.requests[-1]["messages"][0]
    assert system["role"] == "system" and '"parameters"' in system["content"]
    assert manifest["summary"]["calls_from_server"] == 2


async def test_bfcl_reads_the_servers_tool_calls(tmp_path):
    manifest = await run_generation(server_for(FakeServer()), "bfcl_simple", tmp_path, limit=3)
    rows = load_rows(tmp_path)
    assert all(row["call_source"] == "server" for row in rows)
    # Called with no arguments: every record has a required parameter, so none is right.
    assert manifest["summary"]["correct"] == 0 and rows[0]["reason"].startswith("missing required parameter")
    assert manifest["tool_probe"]["template_shows_tools"] is True


async def test_a_cancelled_run_records_what_finished_and_resumes(tmp_path):
    # Ctrl-C reaches run_generation as a cancel of its task (asyncio.run): the rows answered by then
    # are in the record file, the manifest says "interrupted", and the next run asks only the rest.
    import asyncio

    fake = FakeServer()
    answered, stuck = 0, asyncio.Event()

    async def stalls_after_three(request: httpx.Request) -> httpx.Response:
        nonlocal answered
        if request.url.path == "/v1/chat/completions":
            if answered >= 3:
                await stuck.wait()  # a long generation, never finished
            answered += 1
        return fake(request)

    server = ChatServer("http://fake", transport=httpx.MockTransport(stalls_after_three))
    run = asyncio.create_task(run_generation(server, "gsm8k", tmp_path, limit=6, concurrency=2))
    while answered < 3 or len(fake.requests) < 3:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the third row reaches the writer
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["summary"]["records"] == 3
    assert len(load_rows(tmp_path)) == 3 and not list(tmp_path.glob("*.partial.jsonl"))

    fake.requests = []
    manifest = await run_generation(server_for(fake), "gsm8k", tmp_path, limit=6, concurrency=2)
    assert len(fake.requests) == 3 and manifest["summary"]["correct"] == 6 and manifest["status"] == "success"


async def test_the_tools_prompt_is_a_setting_of_the_run(tmp_path):
    # The system message's text is recorded: a run under another text is not resumed into the directory.
    from eval.generation import run as generation

    fake = FakeServer(shows_tools=False)
    manifest = await run_generation(server_for(fake), "bfcl_simple", tmp_path, limit=1, tools_in_prompt=True)
    assert manifest["args"]["tools_prompt"] == generation.TOOLS_SYSTEM_PROMPT
    system = fake.requests[-1]["messages"][0]["content"]
    assert "<tools>[{" in system and "<tool_call>[" in system
    original = generation.TOOLS_SYSTEM_PROMPT
    try:
        generation.TOOLS_SYSTEM_PROMPT = "Call {functions}."
        with pytest.raises(RunRefused, match="tools_prompt"):
            await run_generation(server_for(fake), "bfcl_simple", tmp_path, limit=1, tools_in_prompt=True)
    finally:
        generation.TOOLS_SYSTEM_PROMPT = original
