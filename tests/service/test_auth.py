"""API keys: Bearer keys checked as hashes; 401 authentication_error; keys never logged; loopback-only
without keys unless --no-auth."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from service.keys import KEYS_ENV, Keyring, check_bind, digest, load_key_set
from service.scopes import DEFAULT_SCOPES

KEY = "od-live-4f9a1c2b7e8d6a5f"
OTHER = "od-live-0000000000000000"
BODY = {"state": "Refund me.", "questions": {"q": {"type": "noul", "instructions": "Is it about money?"}}}


@pytest.mark.anyio
@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "missing API key"),
        ({"authorization": f"Bearer {OTHER}"}, "invalid API key"),
        ({"authorization": f"Basic {KEY}"}, "missing API key"),
        ({"authorization": "Bearer "}, "missing API key"),
        ({"authorization": f"Bearer {KEY}x"}, "invalid API key"),
    ],
)
async def test_missing_or_wrong_key_is_a_401(client_factory, quick_engine, headers, message):
    async with client_factory(quick_engine, api_keys=[KEY]) as client:
        response = await client.post("/v1/systemone", json=BODY, headers=headers)
        models = await client.get("/v1/models", headers=headers)
        metrics = await client.get("/metrics", headers=headers)
    for refused in (response, models, metrics):
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        detail = refused.json()["detail"]
        assert detail["error_type"] == "authentication_error" and message in detail["message"]
        assert KEY not in refused.text and OTHER not in refused.text


@pytest.mark.anyio
async def test_a_right_key_passes_and_probes_need_none(client_factory, quick_engine, tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{OTHER} tenant=ops scopes=admin\n{KEY}\n")
    async with client_factory(quick_engine, api_keys=Keyring(path, {})) as client:
        answered = await client.post("/v1/systemone", json=BODY, headers={"authorization": f"bearer {KEY}"})
        live = await client.get("/healthz")
        ready = await client.get("/readyz")
        metrics = await client.get("/metrics", headers={"authorization": f"Bearer {OTHER}"})
    assert answered.status_code == 200 and live.status_code == 200 and ready.status_code == 200
    assert metrics.status_code == 200 and b"decide_requests_total" in metrics.content


@pytest.mark.anyio
async def test_with_auth_off_an_authorization_header_is_ignored(client_factory, quick_engine):
    async with client_factory(quick_engine) as client:
        response = await client.post("/v1/systemone", json=BODY, headers={"authorization": "Bearer anything"})
    assert response.status_code == 200


@pytest.mark.anyio
async def test_keys_never_reach_the_logs_but_their_ids_do(client_factory, quick_engine, caplog):
    caplog.set_level(logging.DEBUG)
    async with client_factory(quick_engine, api_keys=[KEY]) as client:
        await client.post("/v1/systemone", json=BODY, headers={"authorization": f"Bearer {KEY}"})
        await client.post("/v1/systemone", json=BODY, headers={"authorization": f"Bearer {OTHER}"})
    assert KEY not in caplog.text and OTHER not in caplog.text
    access = [r.getMessage() for r in caplog.records if r.name == "opendecide.access"]
    assert len(access) == 2 and '"key_id": "' in access[0] and '"status": 401' in access[1]


def test_app_refuses_auth_on_with_no_keys():
    from service.app import create_app

    with pytest.raises(ValueError, match="no API keys"):
        create_app(open_engine=lambda: None, api_keys=[]).build_middleware_stack()


def test_keys_from_file_and_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# ops team\n{KEY}\n\n  {OTHER}  \n")
    keys = load_key_set(path, {KEYS_ENV: " od-env-key-aaaaaaaaaaaa , "}).keys
    assert [k.digest for k in keys] == [digest(KEY), digest(OTHER), digest("od-env-key-aaaaaaaaaaaa")]
    assert all(k.tenant == "default" and k.scopes == DEFAULT_SCOPES and k.bare for k in keys)
    assert load_key_set(None, {}).keys == ()


def test_a_short_key_is_refused_by_line_never_echoed(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY}\nshort-secret\n")
    with pytest.raises(ValueError) as raised:
        load_key_set(path, {})
    assert "line 2" in str(raised.value) and "short-secret" not in str(raised.value)


@pytest.mark.parametrize(
    "host, has_keys, no_auth, outcome",
    [
        ("127.0.0.1", False, False, "OFF"),
        ("::1", False, False, "OFF"),
        ("localhost", False, False, "OFF"),
        ("0.0.0.0", False, False, "refusing"),
        ("10.1.2.3", False, False, "refusing"),
        ("0.0.0.0", False, True, "OFF"),
        ("0.0.0.0", True, False, None),
    ],
)
def test_bind_rules(host, has_keys, no_auth, outcome):
    if outcome == "refusing":
        with pytest.raises(ValueError, match="refusing to serve on"):
            check_bind(host, has_keys=has_keys, no_auth=no_auth)
    else:
        notice = check_bind(host, has_keys=has_keys, no_auth=no_auth)
        assert (notice is None) if outcome is None else ("authentication is OFF" in notice)


def test_serve_refuses_a_public_bind_without_keys(monkeypatch):
    from opendecide.cli import app

    monkeypatch.delenv(KEYS_ENV, raising=False)
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "1"])
    assert result.exit_code != 0 and "refusing to serve on 0.0.0.0 without API keys" in result.output
