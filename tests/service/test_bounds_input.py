"""Input strictness on the real app: bodies must be UTF-8 (415), look-alike option names are one
option (422, compared after NFKC without invisible characters), the name as sent is kept in answers."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.anyio


def choice(options: list[str]) -> dict:
    return {
        "state": "A fruit bowl.",
        "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": dict.fromkeys(options)}},
    }


@pytest.mark.parametrize(
    ("encoding", "state"),
    [
        ("utf-16", "Café crème"),
        ("utf-16-le", "Café crème"),
        ("utf-32", "Café crème"),
        ("latin-1", "Café crème"),
        # ASCII only: every byte decodes as UTF-8 (ASCII and NULs), and json.loads(bytes) would detect
        # the UTF-16/32 itself.
        ("utf-16-le", "Plain coffee"),
        ("utf-16-be", "Plain coffee"),
        ("utf-32-le", "Plain coffee"),
        ("utf-32", "Plain coffee"),
    ],
)
async def test_a_body_not_utf8_is_refused_with_415(client_factory, quick_engine, encoding, state):
    body = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}
    async with client_factory(quick_engine) as client:
        response = await client.post(
            "/v1/systemone",
            content=json.dumps(body, ensure_ascii=False).encode(encoding),
            headers={"content-type": "application/json"},
        )
        same_in_utf8 = await client.post("/v1/systemone", json=body)
    assert response.status_code == 415, response.text
    detail = response.json()["detail"]
    assert detail["error_type"] == "unsupported_media_type" and "UTF-8" in detail["message"]
    assert detail["param"] == "body"
    assert same_in_utf8.status_code == 200


@pytest.mark.parametrize(
    "options",
    [
        ["A", "\uff21"],  # full-width A
        ["apple", "ap\u200bple"],  # zero-width space inside
        ["apple", "\ufeffapple"],  # a byte-order mark in front
        ["co\u00adop", "coop"],  # soft hyphen
        ["ﬁne", "fine"],  # the fi ligature
        ["café", "cafe\u0301"],  # composed and decomposed, as before
    ],
    ids=["fullwidth", "zero-width-space", "bom", "soft-hyphen", "ligature", "nfc"],
)
async def test_look_alike_option_names_are_duplicates(client_factory, quick_engine, options):
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=choice([*options, "other"]))
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert item["loc"][-1] == "criteria" and "duplicate options" in item["msg"]


async def test_names_as_sent_are_kept_in_answers(client_factory, quick_engine):
    options = ["\uff21pple", "Banana\u200b"]
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=choice(options))
    assert response.status_code == 200, response.text
    assert list(response.json()["answers"]["q"]["probabilities"]) == options


async def test_only_invisible_characters_are_an_empty_name(client_factory, quick_engine):
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=choice(["\u200b\u200d", "B"]))
    assert response.status_code == 422 and "must not be empty" in response.text
