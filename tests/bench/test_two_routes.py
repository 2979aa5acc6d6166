"""bench/two_routes.py end to end on the embedded model: both routes, one repeat, the question cap.

The figures are never checked (no timed assertions): only that each row is measured through the
service, both routes answer the same sizes, and a size over the cap (``MAX_QUESTIONS``, one for both
routes) is shown refused by both, not timed.
"""

from __future__ import annotations

import json

import pytest

from bench import two_routes
from service.protocol import MAX_QUESTIONS

pytestmark = [pytest.mark.slow, pytest.mark.anyio]  # 1 + 1 + 10 + 10 questions read by the embedded model


async def test_both_routes_are_timed_and_the_cap_is_shown(local_engine, capsys):
    over = MAX_QUESTIONS + 1
    await two_routes.main([1, 10, over], request_cost=400_000, repeats=1, engine=local_engine)
    lines = capsys.readouterr().out.splitlines()
    header = json.loads(lines[0])
    assert header["sizes"] == [1, 10, over] and header["max_questions"] == MAX_QUESTIONS
    rows = {(row.split()[0], int(row.split()[1])): row.split()[2:] for row in lines[2:]}
    assert set(rows) == {(route, n) for route in ("jev", "openai") for n in (1, 10, over)}
    for n in (1, 10):
        assert rows["jev", n][0] == rows["openai", n][0] == "200"
        assert float(rows["jev", n][1]) > 0 and float(rows["openai", n][1]) > 0
    assert rows["jev", over][:2] == ["422", "refused"]
    assert rows["openai", over][:2] == ["400", "refused"]  # OpenAI's status for a bad request
