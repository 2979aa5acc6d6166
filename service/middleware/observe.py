"""ASGI middleware: request metrics (count, latency, in flight) and one JSON access-log line per request.

The log line carries the request id, route, status, latency, the caller's key id (a hash prefix, never
the key), and — set by the decision handlers in ``scope["state"]`` — the model and the decision ids, so
a decision can be traced from a client's feedback back to the request that made it.

A client that disconnects before its answer is its own outcome: status ``disconnected`` in the metrics
and ``"status": null, "outcome": "disconnected"`` in the log, never a 500 (nothing failed here).
"""

from __future__ import annotations

import json
import logging
import time

from service.metrics import ServiceMetrics
from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("opendecide.access")


class ObserveMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: int | None = None
        completed = False
        left = False
        route = scope["path"] if scope["path"] in KNOWN_ROUTES else "other"
        state = scope.setdefault("state", {})

        async def record_status(message: Message) -> None:
            nonlocal status, completed
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        async def note_disconnect() -> Message:
            nonlocal left
            message = await receive()
            if message["type"] == "http.disconnect" and not completed:
                left = True
            return message

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, note_disconnect, record_status)
        finally:
            self.metrics.in_flight.dec()
            elapsed = time.monotonic() - started
            disconnected = state.get("disconnected", False) or (left and not completed)
            outcome = "disconnected" if disconnected else "answered" if status is not None else "failed"
            label = "disconnected" if disconnected else str(status or 500)
            self.metrics.requests.labels(route, label).inc()
            self.metrics.request_seconds.labels(route).observe(elapsed)
            access_log.info(
                json.dumps(
                    {
                        "request_id": state.get("request_id"),
                        "method": scope["method"],
                        "route": scope["path"],
                        "status": None if disconnected else status or 500,
                        "outcome": outcome,
                        "latency_ms": round(elapsed * 1000, 3),
                        "key_id": state.get("key_id"),
                        "model": state.get("model"),
                        "decision_ids": state.get("decision_ids", []),
                        # OpenAI's end-user id, only where a caller sent one (service/routes/openai_decisions.py).
                        **(
                            {"safety_identifier": state["safety_identifier"]}
                            if "safety_identifier" in state
                            else {}
                        ),
                    }
                )
            )


KNOWN_ROUTES = frozenset(
    {
        "/v1/systemone",
        "/decide",
        "/decide/batch",
        "/v1/decisions",
        "/v1/models",
        "/v1beta/decisions",
        "/v1beta/models",
        "/v1/calibrations",
        "/v1/calibrations/refit",
        "/v1/feedback",
    }
)
