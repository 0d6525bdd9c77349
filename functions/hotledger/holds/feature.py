"""Holds' registration (hotledger.features): their routes, the delay queue that ends expired holds, and the
reconciler part that ends those whose delay element was lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart

# an expired hold counts for nothing at once; its expiry entry is the drainer's, and the reconciler's past this grace
EXPIRY_GRACE_MS = 60_000


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.holds.service import HOLD_EXPIRY

    return {HOLD_EXPIRY: runtime.holds().expire_due}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    holds = runtime.holds()

    def expired_holds(run: PartContext) -> int:
        after, ended = run.cursor, 0
        while not run.budget.exhausted:
            due = holds.overdue(run.now_ms - EXPIRY_GRACE_MS, after, run.budget.page(100))
            if not due:
                return 0
            for user_id, hold_id in due:
                ended += holds.expire(user_id, hold_id, adopt=True)
            run.budget.spend(len(due))
            after = due[-1][1]
            run.report.holds_expired = ended
        return after

    return (ReconcilePart(name="holds", run=expired_holds),)


FEATURE = Feature(
    name="holds", routes="hotledger.holds.routes", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers
)
