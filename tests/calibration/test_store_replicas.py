"""Two real ``decide serve`` replicas (embedded model, uvicorn) on one PostgreSQL database.

A fit stored by one replica is applied by the other's next answer without a restart, in both
directions; feedback sent to both at once, with one replica killed (SIGKILL) mid-stream, loses no
acknowledged write.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from deploy.processes import free_port, wait_for_models

ROOT = Path(__file__).resolve().parents[2]
QUESTION = {
    "type": "choice",
    "instructions": "Is this review positive or negative?",
    "criteria": {"positive": "the reviewer liked it", "negative": "the reviewer did not"},
}
REVIEWS = [
    ("A warm, funny film with a great cast.", "positive"),
    ("Dull, slow and far too long.", "negative"),
    ("I loved every minute of it.", "positive"),
    ("The plot makes no sense and the acting is wooden.", "negative"),
    ("A delightful surprise from start to finish.", "positive"),
    ("Boring. I walked out halfway through.", "negative"),
    ("Beautifully shot and deeply moving.", "positive"),
    ("A mess of clichés and bad jokes.", "negative"),
    ("Smart, sharp and genuinely thrilling.", "positive"),
    ("Forgettable at best, painful at worst.", "negative"),
    ("One of the best films of the year.", "positive"),
    ("Not worth the price of the ticket.", "negative"),
]


class Replica:
    """``python -m opendecide serve --store <url>`` on a free port, its output in a log file."""

    def __init__(self, url: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "opendecide", "serve", "--store", url, "--port", str(self.port)],
            cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120)

    def wait_ready(self, timeout_s: float = 180) -> None:
        wait_for_models(
            f"http://127.0.0.1:{self.port}", process=self.process, log=self.log, timeout_s=timeout_s
        )

    def ask(self, state: str) -> dict:
        reply = self.http.post("/v1/systemone", json={"state": state, "questions": {"s": QUESTION}})
        assert reply.status_code == 200, reply.text
        return reply.json()["answers"]["s"]

    def decide_all(self, states: list[str]) -> list[str]:
        reply = self.http.post("/decide/batch", json={"states": states, "questions": {"s": QUESTION}})
        assert reply.status_code == 200, reply.text
        return [result["answers"]["s"]["x_reading"]["decision_id"] for result in reply.json()["results"]]

    def feedback(self, decision_id: str, gold: str) -> int:
        reply = self.http.post("/v1/feedback", json={"decision_id": decision_id, "gold": gold})
        assert reply.status_code == 200, reply.text
        return reply.json()["recorded"]

    def refit(self) -> dict:
        reply = self.http.post("/v1/calibrations/refit", json={"question_type": "choice", "option_count": 2})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def listed(self) -> list[str]:
        return [c["id"] for c in self.http.get("/v1/calibrations").json()["calibrations"]]

    def stop(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


@pytest.fixture
def replicas(postgres_url, embedded_model_dir, tmp_path):
    started = [Replica(postgres_url, tmp_path / f"replica-{name}.log") for name in "ab"]
    try:
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            replica.stop()


def picked_up(replica: Replica, calibration_id: str, timeout_s: float = 10.0) -> float:
    """Seconds until ``replica`` lists the calibration (its cache, the one answers read)."""
    start = time.monotonic()
    while calibration_id not in replica.listed():
        assert time.monotonic() - start < timeout_s, f"{calibration_id} not picked up"
        time.sleep(0.01)
    return time.monotonic() - start


def calibrated(raw: dict[str, float], temperature: float) -> dict[str, float]:
    weights = {o: math.exp(math.log(p) / temperature) for o, p in raw.items()}
    return {o: w / sum(weights.values()) for o, w in weights.items()}


@pytest.mark.integration
def test_a_fit_on_one_replica_is_applied_by_the_other_without_a_restart(replicas):
    a, b = replicas
    assert b.ask("An odd little film.")["x_reading"]["calibration"] is None

    ids = a.decide_all([text for text, _ in REVIEWS])
    for i, (decision_id, (_, gold)) in enumerate(zip(ids, REVIEWS)):
        (a if i % 2 else b).feedback(
            decision_id, gold
        )  # decisions served by A, gold answers given through both
    fitted = a.refit()
    assert fitted["n"] == len(REVIEWS) and fitted["source"] == "feedback"
    print(f"B picked up A's fit after {1000 * picked_up(b, fitted['id']):.0f} ms")
    answer = b.ask("An odd little film.")
    used = answer["x_reading"]["calibration"]
    assert (used["mode"], used["id"], used["temperature"], used["n"]) == (
        "temperature",
        fitted["id"],
        fitted["temperature"],
        fitted["n"],
    )
    # A choice question: served prior-corrected by default, so fitted on corrected reads and applied after the correction.
    assert used["read_version"] == fitted["read_version"] and fitted["read_version"].endswith("+prior")
    raw, prior = answer["x_reading"]["raw_probabilities"], answer["x_reading"]["prior_correction"]["prior"]
    corrected = {o: raw[o] / prior[o] for o in raw}
    corrected = {o: p / sum(corrected.values()) for o, p in corrected.items()}
    assert answer["probabilities"] == pytest.approx(calibrated(corrected, fitted["temperature"]))

    more = b.decide_all([text for text, _ in REVIEWS[:4]])
    for decision_id, (_, gold) in zip(more, REVIEWS):
        b.feedback(decision_id, gold)
    refitted = b.refit()  # and the other way round: A applies B's refit
    assert refitted["n"] == len(REVIEWS) + 4 and refitted["id"] != fitted["id"]
    print(f"A picked up B's refit after {1000 * picked_up(a, refitted['id']):.0f} ms")
    assert a.ask("An odd little film.")["x_reading"]["calibration"]["id"] == refitted["id"]


@pytest.mark.integration
def test_feedback_from_both_replicas_survives_killing_one(replicas, postgres_url):
    a, b = replicas
    ids = {replica: replica.decide_all([text for text, _ in REVIEWS]) for replica in (a, b)}
    acknowledged: dict[Replica, list[int]] = {a: [], b: []}
    stop, killed = threading.Event(), threading.Event()

    def send(replica: Replica) -> None:
        i = 0
        while not stop.is_set():
            decision_id = ids[replica][i % len(REVIEWS)]
            try:
                acknowledged[replica].append(replica.feedback(decision_id, REVIEWS[i % len(REVIEWS)][1]))
            except httpx.TransportError:
                if replica is a and killed.is_set():
                    return  # whatever A acknowledged before its kill must be stored
                raise
            i += 1

    with ThreadPoolExecutor(4) as pool:
        senders = [pool.submit(send, replica) for replica in (a, a, b, b)]
        deadline = time.monotonic() + 120
        while len(acknowledged[a]) < 100:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        killed.set()
        a.process.send_signal(signal.SIGKILL)  # mid-stream: A has requests in flight
        at_kill = len(acknowledged[b])
        while len(acknowledged[b]) < at_kill + 100:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stop.set()
        for sender in senders:
            sender.result()
    assert a.process.wait(timeout=30) == -signal.SIGKILL
    with psycopg.connect(postgres_url) as db:
        stored = {seq for (seq,) in db.execute("SELECT seq FROM feedback")}
    for replica in (a, b):
        assert set(acknowledged[replica]) <= stored
    assert len(set(acknowledged[a]) | set(acknowledged[b])) == len(acknowledged[a]) + len(acknowledged[b])
    print(
        f"acknowledged {len(acknowledged[a])} by A (killed) and {len(acknowledged[b])} by B; {len(stored)} stored"
    )


@pytest.mark.integration  # a `decide serve` process
def test_serve_names_the_store_it_cannot_open_without_its_password():
    command = [
        sys.executable,
        "-m",
        "opendecide",
        "serve",
        "--store",
        "postgresql://decide:secret@127.0.0.1:9/none",
    ]  # port 9: no one
    wide = {**os.environ, "COLUMNS": "300"}  # the error box on one line per message, the URL unbroken
    done = subprocess.run(
        command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120, env=wide
    )
    assert done.returncode == 2 and "--store" in done.stderr
    assert "postgresql://decide:***@127.0.0.1:9/none" in done.stderr and "secret" not in done.stderr
