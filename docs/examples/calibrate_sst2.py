"""docs/calibration.md's walk-through: 60 SST-2 reviews from eval/data as examples with gold answers.

    make serve            # in one shell
    .venv/bin/python docs/examples/calibrate_sst2.py [--url http://127.0.0.1:8000]

Posts them to /v1/calibrations under the domain tag "movie-reviews", then asks one decision with
that tag and sends its feedback; prints each reply. tests/test_readme.py runs `walk_through` against
the real service on the embedded model and checks the replies the doc shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eval.decisions.tasks import TASKS, load_sample, spread

QUESTION = {
    "type": "choice",
    "instructions": "What is the sentiment of this movie review?",
    "criteria": dict.fromkeys(TASKS["sst2"].options),
}


async def post(client: httpx.AsyncClient, path: str, body: dict) -> dict:
    reply = await client.post(path, json=body)
    reply.raise_for_status()
    return reply.json()


async def walk_through(client: httpx.AsyncClient) -> dict[str, dict]:
    """The three replies: the fit, the answer decided with its domain tag, and the feedback's."""
    examples = [
        {"state": r.text, "questions": {"sentiment": QUESTION}, "gold": {"sentiment": r.gold}}
        for r in spread(load_sample("sst2"), 60)
    ]
    fit = await post(client, "/v1/calibrations", {"domain": "movie-reviews", "examples": examples})
    body = {
        "domain": "movie-reviews",
        "state": "A tender, funny film that I would happily watch again.",
        "questions": {"sentiment": QUESTION},
    }
    answer = (await post(client, "/v1/systemone", body))["answers"]["sentiment"]
    feedback = {"decision_id": answer["x_reading"]["decision_id"], "gold": "positive"}
    return {"fit": fit, "answer": answer, "feedback": await post(client, "/v1/feedback", feedback)}


async def main(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for reply in (await walk_through(client)).values():
            print(json.dumps(reply, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    asyncio.run(main(parser.parse_args().url))
