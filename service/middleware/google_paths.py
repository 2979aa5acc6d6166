"""ASGI middleware: Google's SDK at its default API version reaches Google's routes.

google-genai 3.3.0 pointed at a base URL without an ``api_version`` sends ``POST /v1/decisions`` (its
default version is ``v1``; ``client.models`` likewise ``/v1/models``), paths where this service speaks
OpenAI's and Jev's formats. Its requests say who sends them: ``x-goog-api-key`` (the SDK refuses to
start without a key) and ``x-goog-api-client``. Such a request on those paths is served as the
``/v1beta/`` one (``service/routes/google_decisions.py``), before anything else sees the path, so
its errors, metrics and access log are Google's route's. A Gemini user changes only the base URL.
Without either header nothing changes: an OpenAI or Jev client never sends them.
"""

from __future__ import annotations

from service.middleware.asgi import ASGIApp, Receive, Scope, Send

GOOGLE_HEADERS = frozenset({b"x-goog-api-key", b"x-goog-api-client"})
GOOGLE_PATHS = {"/v1/decisions": "/v1beta/decisions", "/v1/models": "/v1beta/models"}
GOOGLE_MODEL_PREFIX = "/v1/models/"


def google_path(path: str) -> str | None:
    """The ``/v1beta/`` path a Google client's request to ``path`` means, or None."""
    if path in GOOGLE_PATHS:
        return GOOGLE_PATHS[path]
    if path.startswith(GOOGLE_MODEL_PREFIX):
        return "/v1beta/models/" + path[len(GOOGLE_MODEL_PREFIX) :]
    return None


class GooglePathsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            target = google_path(scope["path"])
            if target is not None and any(name in GOOGLE_HEADERS for name, _ in scope["headers"]):
                scope = dict(scope, path=target, raw_path=target.encode())
        await self.app(scope, receive, send)
