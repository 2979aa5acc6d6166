"""deploy/acceptance/fairness/'s own parts that need no server: its arguments, the table it prints, the
figures it reports, and the rows it writes into a store file as another process would. (The probe itself
runs for minutes against a real ``decide serve``: ``python -m deploy.acceptance.fairness``.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calibration.sqlite_store import SQLiteStore
from calibration.store import CalibrationKey
from deploy.acceptance.fairness import run, session, stalls


def test_arguments_pick_the_sizes_and_the_scenarios(capsys):
    assert run.parser().parse_args(["--quick", "--only", "half_open"]).only == ["half_open"]
    with pytest.raises(SystemExit):
        run.parser().parse_args(["--only", "no_such_scenario"])
    with pytest.raises(SystemExit):
        run.parser().parse_args(["--help"])
    assert "--quick" in capsys.readouterr().out
    # --quick shrinks the floods, never the single requests
    assert session.QUICK.flood_states < session.Sizes().flood_states
    assert (session.QUICK.body_mb, session.QUICK.half_open) == (14.0, 1_100)
    assert run.SCENARIOS[0] == "abandoned_batch"  # it needs a server that has measured nothing


def test_the_table_has_a_target_and_a_verdict_per_row():
    probe = session.Fairness(None, None, None, "", None, port=0, store=Path())
    probe.check("a | b", "then", "now", "≤ 3×", True)
    probe.check("c", "x", "y", "z", False)
    lines = run.table([*zip(probe.rows, probe.targets, strict=True), stalls.engine_hang()]).splitlines()
    assert lines[0].count("|") == 6
    assert lines[2] == "| a \\| b | then | now | ≤ 3× | PASS |"
    assert lines[3].endswith("| FAIL |") and lines[4].endswith("| see test |")


def test_figures_are_percentiles_ranges_and_counts():
    assert session.spread([0.1, 0.2, 0.3]) == "p50 200 ms, p99 300 ms, range 100 ms–300 ms"
    assert session.spread([]) == "no answers"
    assert session.counts([529, 200, 529, "ReadError"]) == "1 × 200, 2 × 529, 1 × ReadError"


def test_fits_written_into_the_file_reach_a_store_already_open(tmp_path):
    path = tmp_path / "store.sqlite3"
    served = SQLiteStore(path)  # the server's store, open before the rows are written
    key = CalibrationKey("m", "r", "noul", 2, "d", read_version="v", tenant="a")
    served.add_calibration(key, temperature=1.5, n=12, source="examples")
    stalls.add_fits(path, 24)  # other tenants' copies of the first fit: 25 rows in all
    served.refresh()  # what the store's poller does every poll_s
    found = served.lookup(replace(key, tenant="other-24"))
    assert found is not None and found.tenant == "other-24" and found.temperature == 1.5
    assert len({c.id for c in served.calibrations()}) == 25
