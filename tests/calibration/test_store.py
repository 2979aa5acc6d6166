"""The calibration store on a real SQLite file: lookup order, restart, concurrency, crash safety."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from calibration.store import CalibrationKey, CalibrationStore, DecisionRecord

ROOT = Path(__file__).resolve().parents[2]
KEY = CalibrationKey("smol", "rev1", "choice", 3, "support")


def decision(id_: str, key: CalibrationKey = KEY) -> DecisionRecord:
    return DecisionRecord(id_, key.model, key.revision, key.question_type, key.option_count, key.domain, ["a", "b", "c"], [0.5, 0.3, 0.2])


def test_lookup_takes_the_most_specific_calibration(tmp_path):
    store = CalibrationStore(tmp_path / "cal.sqlite3")
    assert store.lookup(KEY) is None
    by_type = store.add_calibration(CalibrationKey("smol", "rev1", "choice"), temperature=2.0, n=50, source="labels")
    assert store.lookup(KEY) == by_type
    by_count = store.add_calibration(CalibrationKey("smol", "rev1", "choice", 3), temperature=1.5, n=50, source="labels")
    assert store.lookup(KEY) == by_count
    by_domain = store.add_calibration(KEY, temperature=1.2, n=50, source="labels")
    assert store.lookup(KEY) == by_domain
    assert store.lookup(CalibrationKey("smol", "rev1", "choice", 3, "other-domain")) == by_count
    assert store.lookup(CalibrationKey("smol", "rev2", "choice", 3)) is None  # another revision: nothing applies
    newer = store.add_calibration(KEY, temperature=1.1, n=80, source="feedback")
    assert store.lookup(KEY) == newer and len(store.calibrations()) == 3


def test_a_reopened_store_keeps_calibrations_decisions_and_feedback(tmp_path):
    path = tmp_path / "cal.sqlite3"
    store = CalibrationStore(path)
    fitted = store.add_calibration(KEY, temperature=1.7, n=60, source="labels", heldout_ece_after=0.05)
    store.add_decisions([decision("d1")])
    store.add_feedback("d1", "b")
    reopened = CalibrationStore(path)
    assert reopened.lookup(KEY) == fitted
    assert reopened.decision("d1") == decision("d1")
    assert reopened.labelled(KEY) == [([0.5, 0.3, 0.2], 1)]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert reopened._raw().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: durable at commit, not only on a clean exit


def test_fits_by_another_process_are_seen_without_a_restart(tmp_path):
    path = tmp_path / "cal.sqlite3"
    serving = CalibrationStore(path)
    assert serving.lookup(KEY) is None
    fitted = CalibrationStore(path).add_calibration(KEY, temperature=1.3, n=50, source="labels")  # another worker
    assert serving.lookup(KEY) == fitted


def test_a_store_from_before_the_informative_column_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE decisions (id TEXT PRIMARY KEY, model TEXT NOT NULL, revision TEXT NOT NULL, question_type TEXT NOT NULL, "
        "option_count INTEGER NOT NULL, domain TEXT, options TEXT NOT NULL, raw_probabilities TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    old.execute("INSERT INTO decisions VALUES ('d0', 'smol', 'rev1', 'choice', 3, 'support', '[\"a\", \"b\", \"c\"]', '[0.5, 0.3, 0.2]', 'then')")
    old.commit()
    old.close()
    store = CalibrationStore(path)
    store.add_decisions([decision("d1")])
    store.add_feedback("d0", "c")
    assert store.decision("d0").informative and store.decision("d1") == decision("d1")
    assert store.labelled(KEY) == [([0.5, 0.3, 0.2], 2)]


def test_abstentions_are_not_fitted_on(tmp_path):
    store = CalibrationStore(tmp_path / "cal.sqlite3")
    abstained = DecisionRecord("d0", KEY.model, KEY.revision, KEY.question_type, KEY.option_count, KEY.domain, ["a", "b", "c"], [1 / 3] * 3, informative=False)
    store.add_decisions([abstained, decision("d1")])
    store.add_feedback("d0", "a")
    store.add_feedback("d1", "a")
    assert store.labelled(KEY) == [([0.5, 0.3, 0.2], 0)]


def test_latest_feedback_for_a_decision_wins(tmp_path):
    store = CalibrationStore(tmp_path / "cal.sqlite3")
    store.add_decisions([decision("d1"), decision("d2")])
    store.add_feedback("d1", "a")
    store.add_feedback("d2", "c")
    store.add_feedback("d1", "b")  # a correction
    assert sorted(store.labelled(KEY)) == sorted([([0.5, 0.3, 0.2], 2), ([0.5, 0.3, 0.2], 1)])


def test_concurrent_writers_lose_nothing(tmp_path):
    store = CalibrationStore(tmp_path / "cal.sqlite3")
    store.add_decisions([decision(f"d{i}") for i in range(8)])
    errors = []

    def write(worker: int) -> None:
        try:
            for i in range(50):
                store.add_feedback(f"d{worker}", "a")
                if i % 10 == 0:
                    store.add_calibration(KEY, temperature=1.0 + worker, n=10, source="labels")
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    count = sqlite3.connect(tmp_path / "cal.sqlite3").execute("SELECT COUNT(*) FROM feedback").fetchone()[0]
    assert count == 400
    assert sqlite3.connect(tmp_path / "cal.sqlite3").execute("SELECT COUNT(*) FROM calibrations").fetchone()[0] == 40


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from calibration.store import CalibrationStore, DecisionRecord
    store = CalibrationStore({path!r})
    store.add_decisions([DecisionRecord("d", "smol", "rev1", "noul", 2, None, ["true", "false"], [0.6, 0.4])])
    print("ready", flush=True)
    i = 0
    while True:
        seq = store.add_feedback("d", "true" if i % 2 else "false")
        print(seq, flush=True)  # acknowledged only after the commit returned
        i += 1
    """
)


def test_every_acknowledged_feedback_survives_a_kill(tmp_path):
    path = tmp_path / "cal.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), path=str(path))], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    acknowledged = []
    for line in child.stdout:
        acknowledged.append(int(line))
        if len(acknowledged) == 300:
            child.send_signal(signal.SIGKILL)  # mid-stream: the writer is inside its next transaction
            break
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    stored = {row[0] for row in sqlite3.connect(path).execute("SELECT seq FROM feedback")}
    assert set(acknowledged) <= stored
    assert len(stored) >= 300
    CalibrationStore(path)  # and the file still opens as a store
