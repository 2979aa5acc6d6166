"""Tenants and scopes on the real app, over a real SQLite file and a real PostgreSQL server.

Isolation both ways (fits, lists, feedback, refits), a shared fit an admin key published applying to
both tenants, 403 for every scope a key lacks, and audit lines that carry ids, never keys or text.

The engine is a function engine (named as such: it reaches no model) whose reads vary with the state,
so fits have something to fit; what is tested is who sees and changes what, which no engine decides.
"""

from __future__ import annotations

import json
import logging

import pytest

from calibration.open import open_store
from readers.engines.base import EngineReply, ReadMode, ReadRequest
from service.app import create_app
from service.errors import OPENAI_PATHS
from service.keys import Keyring, digest, key_id
from tests.service.support import function_engine

pytestmark = pytest.mark.anyio

A = "tenant-a-key-0123456789abcdef"
B = "tenant-b-key-0123456789abcdef"
ADMIN = "ops-admin-key-0123456789abcdef"
ASKER = "tenant-a-asks-only-0123456789"  # tenant a, decide only
FITTER = "tenant-a-fits-only-0123456789"  # tenant a, calibrate only
KEY_FILE = f"""# three tenants; a's two narrow keys
{A} tenant=a
{B} tenant=b scopes=decide,calibrate
{ADMIN} tenant=ops scopes=decide,calibrate,admin
{ASKER} tenant=a scopes=decide
{FITTER} tenant=a scopes=calibrate
"""
NOUL = {"type": "noul", "instructions": "Does the customer ask for money back?"}
DOMAIN = "refund-desk-7"  # a tenant's tag: never in an audit line


def varied_read(request: ReadRequest) -> EngineReply:
    """Every label returned; the first label's lead varies with the prompt (0.2 to 2.2 nats)."""
    lead = 0.2 + (sum(request.prompt_ids) % 11) * 0.2
    logprobs = {token: (-0.3 if i == 0 else -0.3 - lead - i) for i, token in enumerate(request.label_ids)}
    return EngineReply(logprobs, ReadMode.EXACT, len(request.prompt_ids), 1.0)


@pytest.fixture
def tenants_app(client_factory, local_engine, location, tmp_path):
    # ``location``: the store fixture (tests/calibration/stores.py), a SQLite file or a Postgres database
    """``async with tenants_app(**options) as (client, store)``: the app over ASGI with the five keys."""
    from contextlib import asynccontextmanager

    keys = tmp_path / "keys.txt"
    keys.write_text(KEY_FILE)
    opened = []

    @asynccontextmanager
    async def factory(**options):
        store = open_store(location)
        opened.append(store)
        engine = function_engine(local_engine, varied_read, ReadMode.EXACT)
        async with client_factory(engine, store=store, api_keys=Keyring(keys, {}), **options) as client:
            yield client, store

    yield factory
    for store in opened:
        store.close()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def examples(n: int, *, flip: bool) -> dict:
    """``n`` noul examples; gold is the read's lean (``flip``: its opposite), so fits move answers."""
    return {
        "domain": DOMAIN,
        "examples": [
            {
                "state": f"Ticket {i}: the parcel came late.",
                "questions": {"q": NOUL},
                "gold": {"q": (i % 3 != 0) != flip},
            }
            for i in range(n)
        ],
    }


async def ask(
    client, key: str, state: str = "Ticket 99: where is my parcel?", *, domain: str | None = DOMAIN
):
    body = {"state": state, "questions": {"q": NOUL}} | ({"domain": domain} if domain else {})
    response = await client.post("/v1/systemone", json=body, headers=auth(key))
    assert response.status_code == 200, response.text
    return response.json()["answers"]["q"]


def used(answer: dict) -> str | None:
    calibration = answer["x_reading"]["calibration"]
    return None if calibration is None else calibration["id"]


async def test_fits_lists_feedback_and_refits_are_isolated_both_ways(tenants_app):
    async with tenants_app() as (client, store):
        before_b = await ask(client, B)
        fitted = await client.post("/v1/calibrations", json=examples(12, flip=True), headers=auth(A))
        assert fitted.status_code == 200, fitted.text
        (a_fit,) = fitted.json()["calibrations"]
        assert a_fit["tenant"] == "a" and a_fit["shared"] is False

        # A's fit moves A's answers and not B's; B lists nothing, A lists its own.
        a_answer, b_answer = await ask(client, A), await ask(client, B)
        assert used(a_answer) == a_fit["id"] and used(b_answer) is None
        assert b_answer["noul"] == before_b["noul"]
        listed = {
            k: (await client.get("/v1/calibrations", headers=auth(k))).json()["calibrations"] for k in (A, B)
        }
        assert [c["id"] for c in listed[A]] == [a_fit["id"]] and listed[B] == []

        # B's feedback on A's decision: the same 404 as an id never recorded; A's own is accepted.
        a_decision = a_answer["x_reading"]["decision_id"]
        theirs = await client.post(
            "/v1/feedback", json={"decision_id": a_decision, "gold": True}, headers=auth(B)
        )
        unknown = await client.post(
            "/v1/feedback", json={"decision_id": "dec_nope", "gold": True}, headers=auth(B)
        )
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json() == json.loads(unknown.text.replace("dec_nope", a_decision))
        assert store.gold_rows(_key(store, a_fit)) == []  # nothing of B's reached A's gold answers
        for i in range(10):  # B's feedback on B's own decisions: its refit fits on those alone
            mine = await ask(client, B, f"Ticket {i}: refund?")
            sent = {"decision_id": mine["x_reading"]["decision_id"], "gold": False}
            assert (await client.post("/v1/feedback", json=sent, headers=auth(B))).status_code == 200
        own = await client.post(
            "/v1/feedback", json={"decision_id": a_decision, "gold": True}, headers=auth(A)
        )
        assert own.status_code == 200 and own.json()["gold_answers"] == 1

        # Refits read only the caller's records: A has one gold answer (too few), B has ten.
        refit = {"question_type": "noul", "option_count": 2, "domain": DOMAIN}
        a_refit = await client.post("/v1/calibrations/refit", json=refit, headers=auth(A))
        assert a_refit.status_code == 422 and "1 decisions with a gold answer" in a_refit.text
        b_refit = await client.post("/v1/calibrations/refit", json=refit, headers=auth(B))
        assert b_refit.status_code == 200 and b_refit.json()["tenant"] == "b" and b_refit.json()["n"] == 10
        prior = await client.post(
            "/v1/calibrations/refit", json=refit | {"mode": "state_prior"}, headers=auth(B)
        )
        assert prior.status_code == 200 and prior.json()["n"] == 12  # B's twelve decisions, not A's one
        a_after = await ask(client, A)
        assert used(a_after) == a_fit["id"] and a_after["noul"] == a_answer["noul"]
        assert used(await ask(client, B)) == prior.json()["id"]
        assert {
            c["id"] for c in (await client.get("/v1/calibrations", headers=auth(A))).json()["calibrations"]
        } == {a_fit["id"]}


def _key(store, fit: dict):
    (calibration,) = [c for c in store.calibrations() if c.id == fit["id"]]
    return calibration.key


async def test_a_shared_fit_applies_to_every_tenant_after_its_own(tenants_app):
    async with tenants_app() as (client, _):
        refused = await client.post(
            "/v1/calibrations", json=examples(12, flip=True) | {"shared": True}, headers=auth(A)
        )
        assert refused.status_code == 403 and "'admin' scope" in refused.json()["detail"]["message"]
        published = await client.post(
            "/v1/calibrations", json=examples(12, flip=True) | {"shared": True}, headers=auth(ADMIN)
        )
        assert published.status_code == 200, published.text
        (shared,) = published.json()["calibrations"]
        assert shared["shared"] is True and shared["tenant"] is None
        assert used(await ask(client, A)) == used(await ask(client, B)) == shared["id"]
        for key in (A, B):  # listed to every tenant, as shared
            assert [
                c["id"]
                for c in (await client.get("/v1/calibrations", headers=auth(key))).json()["calibrations"]
            ] == [shared["id"]]
        (own,) = (
            await client.post("/v1/calibrations", json=examples(12, flip=False), headers=auth(A))
        ).json()["calibrations"]
        assert used(await ask(client, A)) == own["id"]  # a tenant's own fit first
        assert used(await ask(client, B)) == shared["id"]  # the other still on the shared one


PREDICATE = {"type": "predicate", "instructions": NOUL["instructions"]}
SCOPED_CALLS = {
    "decide": [
        ("POST", "/v1/systemone", {"state": "s", "questions": {"q": NOUL}}),
        ("POST", "/decide", {"state": "s", "questions": {"q": NOUL}}),
        ("POST", "/decide/batch", {"states": ["s"], "questions": {"q": NOUL}}),
        ("POST", "/v1/decisions", {"model": "gpt-6-luna", "input": "s", "questions": [PREDICATE]}),
    ],
    "calibrate": [
        ("POST", "/v1/calibrations", examples(12, flip=False)),
        ("GET", "/v1/calibrations", None),
        ("POST", "/v1/calibrations/refit", {"question_type": "noul"}),
        ("POST", "/v1/feedback", {"decision_id": "dec_x", "gold": True}),
    ],
    "admin": [("GET", "/metrics", None), ("GET", "/v1/keys", None)],
}
"""Every route a scope guards, with a body it would accept."""


def refusal(response) -> tuple[str, str]:
    """A 403's error type and message, in either error shape (OpenAI's on its route)."""
    body = response.json()
    if response.request.url.path in OPENAI_PATHS:
        return body["error"]["type"], body["error"]["message"]
    return body["detail"]["error_type"], body["detail"]["message"]


async def test_every_scope_a_key_lacks_is_a_403_naming_it(tenants_app):
    async with tenants_app() as (client, _):
        lacking = {"decide": FITTER, "calibrate": ASKER, "admin": A}
        for scope, routes in SCOPED_CALLS.items():
            for method, path, body in routes:
                response = await client.request(method, path, json=body, headers=auth(lacking[scope]))
                assert response.status_code == 403, (scope, path, response.text)
                error_type, message = refusal(response)
                assert error_type == "permission_error" and f"'{scope}' scope" in message, path
        for method, path, body in SCOPED_CALLS["decide"]:
            response = await client.request(method, path, json=body, headers=auth(ASKER))
            assert response.status_code == 200, (path, response.text)
        assert (await client.get("/v1/calibrations", headers=auth(FITTER))).status_code == 200
        keys = await client.get("/v1/keys", headers=auth(ADMIN))
        metrics = await client.get("/metrics", headers=auth(ADMIN))
    assert metrics.status_code == 200 and b"decide_requests_total" in metrics.content
    assert keys.status_code == 200 and {k["key_id"]: k["tenant"] for k in keys.json()["keys"]} == {
        key_id(digest(A)): "a", key_id(digest(B)): "b", key_id(digest(ADMIN)): "ops",
        key_id(digest(ASKER)): "a", key_id(digest(FITTER)): "a",
    }  # fmt: skip
    assert all(secret not in keys.text for secret in (A, B, ADMIN, ASKER, FITTER))


async def test_calibration_changes_are_audited_without_keys_or_text(tenants_app, caplog):
    caplog.set_level(logging.INFO, logger="opendecide.audit")
    async with tenants_app() as (client, _):
        fitted = await client.post("/v1/calibrations", json=examples(12, flip=True), headers=auth(A))
        (fit,) = fitted.json()["calibrations"]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "opendecide.audit"]
    assert lines == [
        {
            "event": "calibration_stored", "tenant": "a", "key_id": key_id(digest(A)), "how": "examples",
            "calibration_id": fit["id"], "shared": False, "model": fit["model"], "question_type": "noul",
            "option_count": 2, "mode": "temperature", "n": 12, "source": "examples",
        }
    ]  # fmt: skip
    assert A not in caplog.text and DOMAIN not in caplog.text and "parcel" not in caplog.text


@pytest.mark.slow  # 24 examples read by the embedded model
async def test_a_shared_fit_on_real_reads_serves_both_tenants_until_one_fits_its_own(
    client_factory, local_engine, tmp_path
):
    """The same on the embedded model's own reads (SST-2 reviews) and a real SQLite file."""
    from eval.decisions.tasks import TASKS, load_sample, spread

    question = TASKS["sst2"].question()
    records = spread(load_sample("sst2"), 24)
    fit = [{"state": r.text, "questions": {"s": question}, "gold": {"s": r.gold}} for r in records]
    keys = tmp_path / "keys.txt"
    keys.write_text(KEY_FILE)
    store = open_store(tmp_path / "real.sqlite3")
    try:
        async with client_factory(local_engine, store=store, api_keys=Keyring(keys, {})) as client:
            published = await client.post(
                "/v1/calibrations", json={"examples": fit[:12], "shared": True}, headers=auth(ADMIN)
            )
            assert published.status_code == 200, published.text
            (shared,) = published.json()["calibrations"]
            review = {"state": "A joyless, plodding mess.", "questions": {"s": question}}

            async def answer(key: str) -> dict:
                response = await client.post("/v1/systemone", json=review, headers=auth(key))
                return response.json()["answers"]["s"]

            a, b = await answer(A), await answer(B)
            # The same fit on the same read; B's read reuses A's cached prefix, equal up to float rounding.
            assert used(a) == used(b) == shared["id"]
            assert b["probabilities"] == pytest.approx(a["probabilities"], abs=1e-4)
            (own,) = (
                await client.post("/v1/calibrations", json={"examples": fit[12:]}, headers=auth(A))
            ).json()["calibrations"]
            a_own, b_again = await answer(A), await answer(B)
    finally:
        store.close()
    assert used(a_own) == own["id"] and used(b_again) == shared["id"]
    assert b_again["probabilities"] == pytest.approx(
        b["probabilities"], abs=1e-4
    )  # A's fit moved nothing of B's
    assert own["temperature"] != pytest.approx(shared["temperature"], abs=1e-3)
    assert a_own["probabilities"] != pytest.approx(a["probabilities"], abs=1e-4)


def test_every_scoped_route_documents_its_403(tmp_path):
    store = open_store(tmp_path / "c.sqlite3")

    async def never():  # the document does not depend on the engine
        raise AssertionError("not opened")

    try:
        paths = create_app(open_engine=never, store=store).openapi()["paths"]
    finally:
        store.close()
    for method, path, _ in (call for calls in SCOPED_CALLS.values() for call in calls):
        responses = paths[path][method.lower()]["responses"]
        assert "403" in responses, (method, path)
        schema = responses["403"]["content"]["application/json"]["schema"]["$ref"]
        assert schema.endswith("/OpenAIErrorResponse" if path in OPENAI_PATHS else "/ErrorResponse"), path


async def test_a_tenants_fit_applies_on_the_openai_route_for_that_tenant_only(tenants_app):
    """The same ownership on /v1/decisions as on Jev's route: A's fit moves A's answers there, B's
    answer is the uncalibrated read, and each route gives a tenant the same number."""
    fit = {"examples": examples(12, flip=True)["examples"]}  # no domain: /v1/decisions sends none
    request = {"model": "gpt-6-luna", "input": "Ticket 99: where is my parcel?", "questions": [PREDICATE]}
    async with tenants_app() as (client, _):
        fitted = await client.post("/v1/calibrations", json=fit, headers=auth(A))
        assert fitted.status_code == 200, fitted.text
        (a_fit,) = fitted.json()["calibrations"]
        answers = {}
        for key in (A, B):
            response = await client.post("/v1/decisions", json=request, headers=auth(key))
            assert response.status_code == 200, response.text
            (answers[key],) = response.json()["answers"]
        a_jev = await ask(client, A, request["input"], domain=None)
        b_jev = await ask(client, B, request["input"], domain=None)
    assert used(answers[A]) == a_fit["id"] and used(answers[B]) is None
    assert answers[A]["probability"] == pytest.approx(a_jev["noul"], abs=1e-9) and used(a_jev) == a_fit["id"]
    assert answers[B]["probability"] == pytest.approx(b_jev["noul"], abs=1e-9) and used(b_jev) is None
    assert answers[A]["probability"] != pytest.approx(
        answers[B]["probability"], abs=1e-3
    )  # the fit moved A's
