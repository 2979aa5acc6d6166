"""bench/two_routes.py end to end on the embedded model: both routes, one repeat, Jev's question cap.

The figures are never checked (no timed assertions): only that each row is measured through the
service, both routes answer the same sizes, and a size over Jev's cap is shown refused, not timed.
"""

from __future__ import annotations

import json

import pytest

from bench import two_routes

pytestmark = [pytest.mark.slow, pytest.mark.anyio]  # 1 + 1 + 65 questions read by the embedded model


async def test_both_routes_are_timed_and_jevs_cap_is_shown(local_engine, capsys):
    await two_routes.main([1, 65], request_cost=400_000, repeats=1, engine=local_engine)
    lines = capsys.readouterr().out.splitlines()
    header = json.loads(lines[0])
    assert header["sizes"] == [1, 65] and header["jev_max_questions"] == 64
    rows = {(row.split()[0], int(row.split()[1])): row.split()[2:] for row in lines[2:]}
    assert set(rows) == {("jev", 1), ("openai", 1), ("jev", 65), ("openai", 65)}
    assert rows["jev", 1][0] == rows["openai", 1][0] == "200" and float(rows["openai", 1][1]) > 0
    assert rows["jev", 65][:2] == ["422", "refused"]
    assert rows["openai", 65][0] == "200" and float(rows["openai", 65][1]) > 0
