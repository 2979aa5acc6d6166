"""Who a request comes from (``Caller``: tenant, key id, scopes) and what each scope allows.

The auth middleware (``service/middleware/auth.py``) puts the caller in ``scope["state"]["caller"]``;
a route asks ``require_scope`` for it, naming what it is about to do, before it reads the body.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.store import DEFAULT_TENANT
from service.errors import PermissionDenied

SCOPES = ("decide", "calibrate", "admin")
"""decide: decisions and batches; calibrate: fits, lists, refits and feedback of the key's tenant;
admin: shared fits, /metrics on the main port, the key set's description."""
DEFAULT_SCOPES = frozenset({"decide", "calibrate"})
"""A bare key's scopes: what every key could do before scopes existed, less nothing (admin is new)."""


@dataclass(frozen=True)
class Share:
    """A tenant's share of the service (key file fields ``weight=`` and ``tokens_per_minute=``).

    ``weight``: while tenants wait for the engine, each is served prompt tokens in proportion to its
    weight (``service/admission.py``). ``tokens_per_minute``: the most prompt tokens the tenant's
    requests may schedule in a minute (None: no limit of its own)."""

    weight: float = 1.0
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        if not (0 < self.weight < float("inf")):
            raise ValueError("weight must be a positive number")
        if self.tokens_per_minute is not None and self.tokens_per_minute < 1:
            raise ValueError("tokens_per_minute must be at least 1")


EQUAL_SHARE = Share()
"""Every tenant's share unless its keys give one."""


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as the middleware puts it in ``scope["state"]["caller"]``."""

    tenant: str
    key_id: str | None  # None: authentication is off
    scopes: frozenset[str]
    share: Share = EQUAL_SHARE
    cache_group: str | None = None
    """The key file's ``cache_group=``: tenants that name one group share prompt caches on purpose.
    None: the tenant's own (``cache_salt``)."""

    @property
    def cache_salt(self) -> str:
        """Whose prompt cache this caller's reads use (``ReadRequest.cache_salt``): its cache group,
        else its tenant. Reads share computed tokens only with reads of the same salt."""
        return f"group:{self.cache_group}" if self.cache_group is not None else f"tenant:{self.tenant}"


ANONYMOUS = Caller(DEFAULT_TENANT, None, frozenset(SCOPES))
"""With auth off every caller is the operator (loopback, or ``--no-auth`` on purpose): every scope."""


def require_scope(state: dict, scope: str, what: str) -> Caller:
    """The request's caller, or 403 ``permission_error`` naming the ``scope`` that ``what`` needs."""
    caller: Caller = state.get("caller", ANONYMOUS)
    if scope not in caller.scopes:
        raise PermissionDenied(
            f"this API key lacks the '{scope}' scope, which {what} needs (its scopes: {','.join(sorted(caller.scopes))})"
        )
    return caller
