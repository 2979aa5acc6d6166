"""ASGI middleware: a token bucket per caller → 429 ``rate_limit_error`` with Retry-After.

The caller is the API key (``key_id``, set by ``AuthMiddleware``), or the client address when auth is
off. Each bucket holds ``burst`` requests and refills at ``requests_per_s``; a request takes one token.
This bounds how often a caller may ask; how much work the asks add up to is admission's job
(``service/admission.py``), which needs the request's token count. Only ``paths`` are limited
(decisions and calibration writes; not health, metrics or the model list).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from service.errors import retry_after_s, send_error
from service.middleware.asgi import ASGIApp, Receive, Scope, Send

LIMITED_PATHS = frozenset(
    {
        "/v1/systemone",
        "/decide",
        "/decide/batch",
        "/v1/decisions",
        "/v1beta/decisions",
        "/v1/calibrations",
        "/v1/feedback",
        "/v1/calibrations/refit",
    }
)
MAX_CALLERS = (
    100_000  # buckets kept; the least recently seen caller's bucket goes first (it would be full again)
)


class TokenBuckets:
    """Buckets by caller; ``take(caller)`` → 0 when a token was taken, else seconds until one is free."""

    def __init__(
        self, requests_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (requests_per_s > 0 and math.isfinite(requests_per_s)):
            raise ValueError("requests_per_s must be a positive number")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        self.rate = requests_per_s
        self.burst = burst
        self.clock = clock
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, caller: str) -> float:
        now = self.clock()
        tokens, last = self.buckets.pop(caller, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self.buckets[caller] = (tokens, now)
        if len(self.buckets) > MAX_CALLERS:
            self.buckets.popitem(last=False)
        return wait


class RateLimitMiddleware:
    def __init__(
        self, app: ASGIApp, *, requests_per_s: float, burst: int, paths: Iterable[str] = LIMITED_PATHS
    ) -> None:
        self.app = app
        self.buckets = TokenBuckets(requests_per_s, burst)
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            state = scope.setdefault("state", {})
            caller = state.get("key_id") or f"addr:{(scope.get('client') or ('unknown',))[0]}"
            wait = self.buckets.take(caller)
            if wait > 0:
                message = f"rate limit of {self.buckets.rate:g} requests/s (burst {self.buckets.burst}) exceeded; retry in {wait:.1f} s"
                await send_error(
                    send, 429, "rate_limit_error", message, headers={"Retry-After": str(retry_after_s(wait))}
                )
                return
        await self.app(scope, receive, send)
