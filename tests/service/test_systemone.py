"""POST /v1/systemone and /decide on the real embedded model, over the in-process HTTP client."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.anyio

REVIEW = "I loved this movie: the acting was superb and the ending made me cry happy tears."
QUESTIONS = {
    "sentiment": {
        "type": "choice",
        "instructions": "What is the sentiment of the review?",
        "criteria": {"positive": "the reviewer liked it", "negative": None},
    },
    "recommends": {"type": "noul", "instructions": "Does the reviewer recommend the movie?"},
    "stars": {
        "type": "score",
        "instructions": "How much did the reviewer like it?",
        "criteria": ["hated it", "disliked it", "mixed", "liked it", "loved it"],
    },
}


async def test_three_question_types_in_jev_shape(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        response = await client.post("/v1/systemone", json={"state": REVIEW, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == local_engine.info.name
    answers = body["answers"]
    assert set(answers) == set(QUESTIONS)

    noul = answers["recommends"]
    assert noul["type"] == "noul" and 0.0 <= noul["noul"] <= 1.0
    assert noul["noul"] == pytest.approx(noul["x_reading"]["raw_probabilities"]["true"])

    choice = answers["sentiment"]
    assert choice["type"] == "choice" and set(choice["probabilities"]) == {"positive", "negative"}
    assert sum(choice["probabilities"].values()) == pytest.approx(1.0)
    assert choice["choice"] == max(choice["probabilities"], key=choice["probabilities"].get)
    p_max = max(choice["probabilities"].values())
    assert choice["confidence"] == pytest.approx((p_max - 1 / 2) / (1 - 1 / 2))  # Jev's formula, n = 2
    assert choice["x_reading"]["top_probability"] == pytest.approx(p_max)

    score = answers["stars"]
    probabilities = score["probabilities"]
    assert list(probabilities) == ["0", "1", "2", "3", "4"]
    assert score["legend"] == {str(i): text for i, text in enumerate(QUESTIONS["stars"]["criteria"])}
    assert score["score"] == pytest.approx(sum(int(level) * p for level, p in probabilities.items()))
    levels = [probabilities[str(i)] for i in range(5)]
    mode = levels.index(max(levels))
    spread = sum(p * abs(i - mode) for i, p in enumerate(levels))
    assert score["confidence"] == pytest.approx(max(0.0, 1 - spread / ((abs(-2) + 1 + 0 + 1 + 2) / 5)))
    assert score["x_reading"]["top_probability"] == pytest.approx(max(levels))
    assert "confidence" not in noul and noul["x_reading"]["top_probability"] == pytest.approx(
        max(noul["noul"], 1 - noul["noul"])
    )

    for answer in answers.values():
        reading = answer["x_reading"]
        assert reading["read_mode"] == "exact" and reading["exact"] and reading["informative"]
        assert reading["labels_returned"] == reading["labels_total"]
        assert not reading["floor_used"] and reading["floor_logprob"] is None
        assert 0 < reading["label_mass"] <= 1
        assert reading["calibration"] is None and reading["latency_ms"] > 0
        assert all(lo == hi for lo, hi in reading["probability_bounds"].values())
        assert all(value is not None and value < 0 for value in reading["label_logprobs"].values())

    assert body["usage"] == {
        "input_tokens": sum(a["x_reading"]["prompt_tokens"] for a in answers.values()),
        "output_tokens": 3,
    }
    provenance = body["x_provenance"]
    assert provenance["engine"] == "local" and provenance["read_mode"] == "exact"
    assert provenance["model_revision"] == local_engine.info.revision
    assert provenance["model_revision"].startswith("gguf-sha256:")
    assert provenance["prompt_version"].startswith("decide-prompt/")
    assert response.headers["x-request-id"] == provenance["request_id"]


async def test_decide_route_shares_the_handler(client_factory, local_engine):
    body = {
        "state": {"subject": "Refund", "message": "I was charged twice."},
        "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}},
    }
    async with client_factory(local_engine) as client:
        a = (await client.post("/v1/systemone", json=body)).json()
        b = (await client.post("/decide", json=body)).json()
    # b reuses a's keys and values: equal to float rounding.
    assert a["answers"]["billing"]["noul"] == pytest.approx(b["answers"]["billing"]["noul"], abs=1e-5)
    assert a["usage"] == b["usage"]


async def test_jev_model_aliases_select_the_served_model(client_factory, local_engine):
    body = {
        "model": "jev-latest",
        "state": "hi",
        "questions": {"q": {"type": "noul", "instructions": "Is it a greeting?"}},
    }
    async with client_factory(local_engine) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 200 and response.json()["model"] == local_engine.info.name


async def test_models_list_in_jev_shape(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        models = (await client.get("/v1/models")).json()["models"]
    assert len(models) == 1
    card = models[0]
    assert card["name"] == local_engine.info.name and card["release_date"] and card["description"]
    assert card["read_mode"] == "exact" and card["engine"] == "local" and card["context_length"] == 8192
    assert "jev-latest" in card["aliases"]


@pytest.mark.slow  # multi-token labels read by the trie
async def test_labels_that_are_not_one_token_are_read_whole_by_the_trie(client_factory, local_engine):
    body = {
        "state": "NASA delays the rocket launch.",
        "questions": {
            "topic": {
                "type": "choice",
                "criteria": {"World": None, "Sports": None, "Business": None, "Sci/Tech": None},
            }
        },
    }
    async with client_factory(local_engine) as client:
        answer = (await client.post("/v1/systemone", json=body)).json()["answers"]["topic"]
    assert answer["x_reading"]["label_style"] == "trie"
    assert answer["x_reading"]["labels"] == {
        "World": " World",
        "Sports": " Sports",
        "Business": " Business",
        "Sci/Tech": " Sci/Tech",
    }  # after "Answer:"
    assert set(answer["probabilities"]) == {"World", "Sports", "Business", "Sci/Tech"}
    assert math.isclose(sum(answer["probabilities"].values()), 1.0)


async def test_top_k_engine_reports_missing_labels(client_factory, local_engine):
    body = {
        "state": "The match ended 2-1.",
        "questions": {
            "topic": {"type": "choice", "criteria": {"positive": None, "negative": None, "neutral": None}}
        },
    }
    async with client_factory(local_engine.with_top_k(1)) as client:
        response = await client.post("/v1/systemone", json=body)
    reading = response.json()["answers"]["topic"]["x_reading"]
    assert reading["read_mode"] == "topk" and response.json()["x_provenance"]["top_k"] == 1
    # Three labels, one token returned: at least two labels are missing and floored.
    assert reading["labels_returned"] <= 1 and reading["floor_used"] and not reading["exact"]
    assert (
        sum(value is None for value in reading["label_logprobs"].values()) == 3 - reading["labels_returned"]
    )


@pytest.mark.slow  # each state read in a batch and alone
async def test_batch_answers_each_state_like_a_single_request(client_factory, local_engine):
    states = ["Great phone, love it.", "Broke after a day.", {"review": "It is fine I guess."}]
    question = {"sentiment": QUESTIONS["sentiment"]}
    async with client_factory(local_engine) as client:
        batch = await client.post("/decide/batch", json={"states": states, "questions": question})
        singles = [
            (await client.post("/decide", json={"state": state, "questions": question})).json()
            for state in states
        ]
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert len(results) == 3
    for result, single in zip(results, singles):
        # The embedded engine batches concurrent reads with padding: equal to float32 rounding (the 1e-4 read bound).
        assert result["answers"]["sentiment"]["probabilities"] == pytest.approx(
            single["answers"]["sentiment"]["probabilities"], abs=1e-4
        )
        assert result["usage"] == single["usage"]
    assert batch.json()["usage"]["input_tokens"] == sum(s["usage"]["input_tokens"] for s in singles)


async def test_batch_refuses_empty_states(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        response = await client.post(
            "/decide/batch", json={"states": [], "questions": {"q": QUESTIONS["recommends"]}}
        )
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "states"]
