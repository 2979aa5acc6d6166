"""API keys: ``Authorization: Bearer <key>`` (what Jev's SDKs send), checked by an ASGI middleware.

Keys come from a file (one per line; blank lines and ``#`` comments skipped) and/or the environment
variable ``OPENDECIDE_API_KEYS`` (comma-separated). Only their SHA-256 digests are held, and a presented
key is compared against every digest with ``hmac.compare_digest`` (no early exit), so neither the
keys' text nor the time a comparison takes says anything about them. A caller is known in logs and
rate limits by its ``key_id``: the first 12 hex digits of the digest, never the key.

Without keys the service must bind to loopback only; ``check_bind`` refuses any other address unless
``--no-auth`` says the operator means it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from service.decompress import ASGIApp, Receive, Scope, Send
from service.errors import send_error

KEYS_ENV = "OPENDECIDE_API_KEYS"
MIN_KEY_CHARS = 16
# Liveness and readiness answer orchestrators' probes, which carry no key; neither says anything a
# caller could use (readiness names the model, as /v1/models would). The OpenAPI document is the
# public contract, fetched by generators before they hold a key.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_id(key_digest: bytes) -> str:
    return key_digest.hex()[:12]


def load_api_keys(path: Path | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """Keys from ``path`` (one per line) and ``$OPENDECIDE_API_KEYS`` (comma-separated), in that order.

    Raises ``ValueError`` for a key shorter than 16 characters or holding whitespace, naming its line
    (never the key)."""
    environ = os.environ if environ is None else environ
    found: list[tuple[str, str]] = []
    if path is not None:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            text = line.strip()
            if text and not text.startswith("#"):
                found.append((f"{path} line {number}", text))
    for index, item in enumerate(environ.get(KEYS_ENV, "").split(","), start=1):
        if item.strip():
            found.append((f"{KEYS_ENV} item {index}", item.strip()))
    for where, key in found:
        if len(key) < MIN_KEY_CHARS or any(ch.isspace() for ch in key):
            raise ValueError(f"API key at {where} must be at least {MIN_KEY_CHARS} characters without spaces")
    return [key for _, key in found]


def check_bind(host: str, *, has_keys: bool, no_auth: bool) -> str | None:
    """Refuse to serve without keys on a non-loopback address unless ``no_auth``; returns the warning
    to log when auth is off, or None when keys are on."""
    if has_keys:
        return None
    loopback = host == "localhost" or _is_loopback(host)
    if not loopback and not no_auth:
        raise ValueError(
            f"refusing to serve on {host} without API keys: pass --api-key-file or set {KEYS_ENV}, "
            "or --no-auth to serve anyone who can reach the port"
        )
    return f"authentication is OFF: anyone who can reach {host} may call this service"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class AuthMiddleware:
    """401 unless the request carries one of ``keys``; ``keys=None`` turns auth off (the header is then
    accepted and ignored). ``open_paths`` need no key."""

    def __init__(
        self, app: ASGIApp, *, keys: Iterable[str] | None, open_paths: Iterable[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        self.digests = None if keys is None else [digest(key) for key in keys]
        if self.digests is not None and not self.digests:
            raise ValueError("auth is on but no API keys were given (pass keys=None to turn auth off)")
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.digests is None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        presented = _bearer(scope)
        if presented is None:
            await _refuse(send, "missing API key: send 'Authorization: Bearer <key>'")
            return
        wanted = digest(presented)
        matched = None
        for known in self.digests:  # every digest compared: the time taken does not depend on which matched
            if hmac.compare_digest(wanted, known):
                matched = known
        if matched is None:
            await _refuse(send, "invalid API key")
            return
        scope.setdefault("state", {})["key_id"] = key_id(matched)
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
            return None
    return None


async def _refuse(send: Send, message: str) -> None:
    await send_error(
        send,
        401,
        "authentication_error",
        message,
        param="Authorization",
        headers={"WWW-Authenticate": "Bearer"},
    )
