"""Holds' registration (hotledger.features) and service: their routes, the delay queue that ends expired holds, and
the reconciler part that ends those whose delay element was lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import lua, stream_flag
from hotledger.features import Feature
from hotledger.holds.service import HOLD_EXPIRY, Holds
from hotledger.holds.store import HoldStore
from hotledger.ledger.feature import ledger
from hotledger.reconciler import ReconcilePart, expiry_part
from hotledger.runtime import delay_queue, durability, id_generator, service

# an expired hold counts for nothing at once; its expiry entry is the drainer's, and the reconciler's past this grace
EXPIRY_GRACE_MS = 60_000


@service
def holds() -> Holds:
    cfg = settings()
    return Holds(
        HoldStore(lua(), stream_flag(cfg), cfg.entry_ttl_s, cfg.max_pending_entries),
        durability(),
        ledger(),
        delay_queue(),
        id_generator().next_id,
    )


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    return {HOLD_EXPIRY: holds().expire_due}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    holds_service = holds()
    return (
        expiry_part(
            "holds",
            holds_service.overdue,
            lambda user_id, hold_id: holds_service.expire(user_id, hold_id, adopt=True),
            lambda: EXPIRY_GRACE_MS,
            "holds_expired",
        ),
    )


FEATURE = Feature(
    name="holds", routes="hotledger.holds.routes", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers
)
