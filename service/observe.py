"""ASGI middleware: request metrics (count, latency, in flight) and one JSON access-log line per request.

The log line carries the request id, route, status, latency, and — set by the decision handlers in
``scope["state"]`` — the model and the decision ids, so a decision can be traced from a client's
feedback back to the request that made it.
"""

from __future__ import annotations

import json
import logging
import time

from service.decompress import ASGIApp, Message, Receive, Scope, Send
from service.metrics import ServiceMetrics

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
        status = 500
        route = scope["path"] if scope["path"] in KNOWN_ROUTES else "other"

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, record_status)
        finally:
            self.metrics.in_flight.dec()
            elapsed = time.monotonic() - started
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(elapsed)
            state = scope.get("state", {})
            access_log.info(
                json.dumps(
                    {
                        "request_id": state.get("request_id"),
                        "method": scope["method"],
                        "route": scope["path"],
                        "status": status,
                        "latency_ms": round(elapsed * 1000, 3),
                        "model": state.get("model"),
                        "decision_ids": state.get("decision_ids", []),
                    }
                )
            )


KNOWN_ROUTES = frozenset(
    {"/v1/systemone", "/decide", "/decide/batch", "/v1/models", "/v1/calibrations", "/v1/calibrations/refit", "/v1/feedback"}
)
