"""Audit lines: who changed what a tenant's answers depend on (calibrations) or who may call (the key set).

One JSON line per change on the ``opendecide.audit`` logger: the event, the tenant and key id that made
it (none for key-set reloads, which the operator makes), and what changed, by id. Never a key, and never
request text: a calibration is named by its id, key, mode and size, not by its domain tag or examples.
"""

from __future__ import annotations

import json
import logging

audit_log = logging.getLogger("opendecide.audit")


def audit(event: str, caller, **what) -> None:
    """Log ``event`` made by ``caller`` (a ``service.scopes.Caller``, or None for the operator)."""
    line = {
        "event": event,
        "tenant": None if caller is None else caller.tenant,
        "key_id": None if caller is None else caller.key_id,
        **what,
    }
    audit_log.info(json.dumps(line, sort_keys=False, default=str))
