"""deploy/acceptance/soak.py for one minute on the embedded model: three tenants' mixed traffic through
the real service and a real SQLite file; no 5xx but those by design, every acknowledged feedback stored,
every kind of request sent, refits that succeed. (The memory goal is the 20-minute run's: a minute
barely warms up. 45 s alone on 2 cores sent 323 requests, 125 feedback and 5 refits, every kind this
test asks for; the two minutes it ran before added none, only a minute of the suite.)"""

from __future__ import annotations

import json

import pytest

from deploy.acceptance import soak


@pytest.mark.slow  # a minute of real-model reads
@pytest.mark.alone  # a time-boxed run: beside another worker it sent too few gold answers for a refit
def test_a_minute_of_mixed_traffic(tmp_path, capsys):
    out = tmp_path / "soak.json"
    status = soak.main(["--minutes", "1", "--store-dir", str(tmp_path), "--out", str(out)])
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert result["goals"]["no_5xx_but_503_504_529"], result["unexpected"]
    assert result["goals"]["nothing_acknowledged_lost"] and result["feedback_acknowledged"] > 0
    kinds = {line.split()[0] for line in result["statuses_by_kind"]}
    assert kinds >= {"noul", "choice", "score", "mixed", "openai", "batch", "feedback", "malformed"}
    assert "openai 200" in result["statuses_by_kind"]
    # Three tenants from the key file, each with its own records; refits sent only with enough gold
    # answers succeed (the run before this fix: "refit 422: 10", all three keys one tenant), or are told
    # to wait by the refit limit (429 with Retry-After, which the client then honours).
    rows = result["store_rows"]
    assert sorted(rows["decisions_by_tenant"]) == ["t0", "t1", "t2"]
    refit_lines = [line for line in result["statuses_by_kind"] if line.startswith("refit ")]
    assert not any(
        line.startswith(("refit 4", "refit 5")) and not line.startswith("refit 429") for line in refit_lines
    )
    assert any(line.startswith("refit 200") for line in refit_lines), refit_lines
    assert rows["calibrations"] >= 1
    assert not any(line.startswith("malformed 2") for line in result["statuses_by_kind"])
    assert result["resources"]["end"]["admission_in_flight"] == 0
    assert "PASS nothing_acknowledged_lost" in printed and "p50" in printed
    assert status == (0 if all(result["goals"].values()) else 1)
