"""Credit grants' registration (hotledger.features) and service: the delay queue that ends grants at their
expires_at, and the reconciler part that ends those whose delay element was lost. Their routes are the accounts' (a
recharge's `grant`, GET /accounts/{id}'s `grants`: ledger/routes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import lua, stream_flag
from hotledger.features import Feature
from hotledger.grants.service import GRANT_EXPIRY, Grants
from hotledger.grants.store import GrantStore
from hotledger.ledger.feature import ledger
from hotledger.reconciler import ReconcilePart, expiry_part
from hotledger.runtime import delay_queue, durability, id_generator, service

# an expired grant counts for nothing at once; its expiry entry is the drainer's, and the reconciler's past this grace
EXPIRY_GRACE_MS = 60_000


@service
def grants() -> Grants:
    cfg = settings()
    return Grants(
        GrantStore(lua(), stream_flag(cfg), cfg.entry_ttl_s),
        durability(),
        ledger(),
        delay_queue(),
        id_generator().next_id,
    )


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    return {GRANT_EXPIRY: grants().expire_due}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    service_ = grants()
    return (expiry_part("grants", service_.overdue, service_.expire, lambda: EXPIRY_GRACE_MS, "grants_expired"),)


FEATURE = Feature(name="grants", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers)
