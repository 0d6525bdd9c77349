"""Credit grants' registration (hotledger.features): the delay queue that ends grants at their expires_at, and the
reconciler part that ends those whose delay element was lost. Their routes are the accounts' (a recharge's `grant`,
GET /accounts/{id}'s `grants`: ledger/routes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart

# an expired grant counts for nothing at once; its expiry entry is the drainer's, and the reconciler's past this grace
EXPIRY_GRACE_MS = 60_000


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.grants.service import GRANT_EXPIRY

    return {GRANT_EXPIRY: runtime.grants().expire_due}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    grants = runtime.grants()

    def expired_grants(run: PartContext) -> int:
        after, ended = run.cursor, 0
        while not run.budget.exhausted:
            due = grants.overdue(run.now_ms - EXPIRY_GRACE_MS, after, run.budget.page(100))
            if not due:
                return 0
            for user_id, grant_id in due:
                ended += grants.expire(user_id, grant_id)
            run.budget.spend(len(due))
            after = due[-1][1]
            run.report.grants_expired = ended
        return after

    return (ReconcilePart(name="grants", run=expired_grants),)


FEATURE = Feature(name="grants", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers)
