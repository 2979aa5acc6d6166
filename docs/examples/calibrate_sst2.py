"""The README's calibration example: 60 SST-2 reviews from eval/data as labelled examples.

    make serve            # in one shell
    .venv/bin/python docs/examples/calibrate_sst2.py [--url http://127.0.0.1:8000]

Posts them to /v1/calibrations under the domain tag "movie-reviews", then asks one decision with
that tag and sends its feedback; prints each reply.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eval.tasks import TASKS, load_sample, spread

QUESTION = {
    "type": "choice",
    "instructions": "What is the sentiment of this movie review?",
    "criteria": dict.fromkeys(TASKS["sst2"].options),
}


def main(url: str) -> None:
    examples = [
        {"state": r.text, "questions": {"sentiment": QUESTION}, "gold": {"sentiment": r.gold}}
        for r in spread(load_sample("sst2"), 60)
    ]
    with httpx.Client(base_url=url, timeout=300) as client:
        fitted = client.post(
            "/v1/calibrations", json={"domain": "movie-reviews", "examples": examples}
        ).json()
        print(json.dumps(fitted, indent=2))
        body = {
            "domain": "movie-reviews",
            "state": "A tender, funny film that I would happily watch again.",
            "questions": {"sentiment": QUESTION},
        }
        answer = client.post("/v1/systemone", json=body).json()["answers"]["sentiment"]
        print(json.dumps(answer, indent=2))
        feedback = {"decision_id": answer["x_reading"]["decision_id"], "gold": "positive"}
        print(json.dumps(client.post("/v1/feedback", json=feedback).json(), indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    main(parser.parse_args().url)
