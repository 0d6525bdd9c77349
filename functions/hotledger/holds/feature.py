"""Holds' registration (hotledger.features): their routes, the delay queue that ends expired holds, and the
reconciler part that ends those whose delay element was lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, ReconcilePart, expiry_part

# an expired hold counts for nothing at once; its expiry entry is the drainer's, and the reconciler's past this grace
EXPIRY_GRACE_MS = 60_000


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.holds.service import HOLD_EXPIRY

    return {HOLD_EXPIRY: runtime.holds().expire_due}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    holds = runtime.holds()
    return (
        expiry_part(
            "holds",
            holds.overdue,
            lambda user_id, hold_id: holds.expire(user_id, hold_id, adopt=True),
            lambda: EXPIRY_GRACE_MS,
            "holds_expired",
        ),
    )


FEATURE = Feature(
    name="holds", routes="hotledger.holds.routes", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers
)
