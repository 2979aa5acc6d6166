"""How often a tenant may refit: one refit per key and mode every ``key_interval_s``, and at most
``per_minute`` refits a minute per tenant (a bucket of that many, refilled over a minute). A refit in
another mode (``state_prior`` after ``temperature``) is another question, not a repeat: the tenant's
bucket bounds them together.

Every refit is a fit and a stored row; unbounded, one calibrate key refitting in a loop stored ~22 fits a
second, all read back by every replica. The limit covers explicit refits (``POST /v1/calibrations/refit``:
over it, 429 ``rate_limit_error`` naming the limit, with Retry-After) and automatic ones
(``auto_refit_every``, triggered by feedback: over it, the refit is skipped, counted on /metrics as
``decide_automatic_refits{outcome="skipped"}``, and the key is owed one, which its next feedback
triggers again). A refit that fails (too few gold answers)
counts too: it read the store all the same. Fits from examples (``POST /v1/calibrations``) are bounded by
admission instead: they cost reads.

Per process: each replica limits its own refits.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from calibration.store import CalibrationKey
from opendecide.tenant_cache import TenantCache
from service.errors import TenantLimited, retry_after_s
from service.middleware.rate_limit import MAX_CALLERS, TokenBuckets

logger = logging.getLogger("opendecide.service")

KEY_INTERVAL_S = 5.0
PER_TENANT_PER_MINUTE = 30


class RefitLimits:
    def __init__(
        self,
        *,
        key_interval_s: float = KEY_INTERVAL_S,
        per_minute: int = PER_TENANT_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
        max_owed: int = MAX_CALLERS,
    ) -> None:
        if key_interval_s < 0:
            raise ValueError("key_interval_s must not be negative")
        self.key_interval_s = key_interval_s
        self.per_minute = per_minute
        self.clock = clock
        self._tenants = TokenBuckets(per_minute / 60, per_minute, clock=clock)
        self._last: OrderedDict[tuple[CalibrationKey, str], float] = OrderedDict()  # → when it last refitted
        # Per tenant, bounded in all: past the bound the tenant owed the most refits gives back
        # first, so one tenant's skipped refits never push another's out (who would then wait for
        # their next multiple of N feedbacks).
        self._owed: TenantCache[bool] = TenantCache(max_owed)

    def check(self, key: CalibrationKey, mode: str) -> None:
        """Take a refit of ``key`` (its tenant's) in ``mode``, or raise ``TenantLimited`` naming the limit
        it is over. Nothing is taken from a refused refit: the key's interval is checked before the
        tenant's bucket."""
        now = self.clock()
        last = self._last.get((key, mode))
        if last is not None and now - last < self.key_interval_s:
            wait = last + self.key_interval_s - now
            raise TenantLimited(
                f"refit limit: one refit per key and mode every {self.key_interval_s:g} s; retry in {wait:.1f} s",
                retry_after_s=retry_after_s(wait),
            )
        wait = self._tenants.take(str(key.tenant))
        if wait > 0:
            raise TenantLimited(
                f"refit limit: {self.per_minute} refits a minute per tenant; retry in {wait:.1f} s",
                retry_after_s=retry_after_s(wait),
            )
        self._last.pop((key, mode), None)
        self._last[key, mode] = now
        self._owed.pop(key.tenant, key)
        if len(self._last) > MAX_CALLERS:  # the oldest is past its interval long before this
            self._last.popitem(last=False)

    def owed(self, key: CalibrationKey) -> bool:
        """Whether an automatic refit of ``key`` was skipped and not made since."""
        return self._owed.peek(key.tenant, key) is not None

    def take_automatic(self, key: CalibrationKey, mode: str) -> bool:
        """Whether an automatic refit of ``key`` in ``mode`` may run now; if not, it is skipped and
        owed (the caller counts it)."""
        try:
            self.check(key, mode)
        except TenantLimited as refused:
            self._owed.put(key.tenant, key, True)
            logger.info("automatic refit skipped (%s)", refused.message)
            return False
        return True
