"""The probe's own parts that need no server: the table it prints, the verdicts, the server's latencies
read from its log, a refusal's reason. (The probe itself runs for minutes against a real ``decide serve``:
``python -m deploy.acceptance.probe``; its rows are checked by running it, evidence/probe/.)"""

from __future__ import annotations

import json

import httpx

from deploy.acceptance.probe.run import table
from deploy.acceptance.probe.session import Probe, Row, reason


def test_the_table_gives_each_row_its_verdict_and_escapes_pipes():
    printed = table([Row("a | b", "then", "now", True), Row("c", "x", "y", False), Row("d", "x", "y", None)])
    lines = printed.splitlines()
    assert lines[2] == "| a \\| b | then | now | PASS |"
    assert lines[3].endswith("| FAIL |") and lines[4].endswith("| see test |")


def test_server_latencies_are_read_from_the_access_log_lines(tmp_path):
    log = tmp_path / "serve.log"
    entries = [{"request_id": "r1", "latency_ms": 1500}, {"request_id": "", "latency_ms": 3}, {"other": 1}]
    log.write_text(
        "starting\n" + "".join(f"INFO access {json.dumps(e)}\n" for e in entries) + "INFO {broken\n"
    )
    probe = Probe(client=None, server=None, keys=tmp_path / "keys", metrics_url="", log=log)
    assert probe.server_latencies_s() == {"r1": 1.5}


def test_a_refusal_reason_is_the_first_validation_message_or_the_error_type():
    invalid = httpx.Response(422, json={"detail": [{"msg": "too long", "loc": ["body", "questions", "q"]}]})
    assert reason(invalid) == "too long at body.questions.q"
    busy = httpx.Response(529, json={"detail": {"error_type": "overloaded", "message": "queue full"}})
    assert reason(busy) == "overloaded: queue full"
    assert reason(httpx.Response(500, text="Internal Server Error")) == "Internal Server Error"
