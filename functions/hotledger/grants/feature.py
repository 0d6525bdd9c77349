"""Credit grants' registration (hotledger.features): the delay queue that ends grants at their expires_at, and the
reconciler part that ends those whose delay element was lost. Their routes are the accounts' (a recharge's `grant`,
GET /accounts/{id}'s `grants`: ledger/routes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, ReconcilePart, expiry_part

# an expired grant counts for nothing at once; its expiry entry is the drainer's, and the reconciler's past this grace
EXPIRY_GRACE_MS = 60_000


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.grants.service import GRANT_EXPIRY

    return {GRANT_EXPIRY: runtime.grants().expire_due}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    grants = runtime.grants()
    return (expiry_part("grants", grants.overdue, grants.expire, lambda: EXPIRY_GRACE_MS, "grants_expired"),)


FEATURE = Feature(name="grants", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers)
