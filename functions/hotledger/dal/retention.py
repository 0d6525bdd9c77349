"""Key records are kept for a stated retention (KEY_RETENTION_DAYS), not for ever: the answers of Idempotency-Keys
(t_idempotency for deducts and recharges, t_route_key for the other routes) and the rollback records (t_rolled_back).
The reconciler's `keys` part deletes the older ones a bounded batch at a time, oldest first, within its budget; the
next run goes on. A key older than the retention is a new key: the request runs again (Stripe keeps keys 24 h)."""

from __future__ import annotations

from hotledger.dal import db
from hotledger.dal.budget import Budget

TABLES = ("t_idempotency", "t_route_key", "t_rolled_back")
BATCH = 500


def prune(older_than_ms: int, budget: Budget) -> dict[str, int]:
    """Delete the records created before `older_than_ms`; table -> rows deleted this run. Every table gets at least
    one batch a run, so a small budget spent on the first cannot starve the others."""
    cutoff, deleted = db.to_datetime(older_than_ms), {}
    for table in TABLES:
        deleted[table] = 0
        while True:
            batch = max(1, budget.page(BATCH))
            gone = db.execute(
                f"DELETE FROM {table} WHERE create_time < %s ORDER BY create_time LIMIT {batch}", (cutoff,)
            )
            budget.spend(max(gone, 1))
            deleted[table] += gone
            if gone < batch or budget.exhausted:
                break
    return deleted
