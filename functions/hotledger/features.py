"""The feature registry: what each feature adds to the API, the writer, the reconciler and the delay drainer, declared
once in its own package (`<feature>/feature.py`) and listed once below. api/app.py includes every feature's router
and api/authorization.py its rules; runtime.py builds the writer from every feature's persisters and the drainer
from every feature's delay handlers; the reconciler runs every feature's parts in this order. Adding a feature is
one package and one line in FEATURES (docs/adding-a-feature.md walks through holds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hotledger.dal.budget import Budget
    from hotledger.reconciler import ReconcileReport


@dataclass(frozen=True)
class PartContext:
    """What one reconciler run gives each part."""

    now_ms: int
    age_s: int  # entries charged longer ago than this count as stale (RECONCILE_AGE_S)
    budget: Budget  # the part's own: it stops at a page boundary when this runs out
    cursor: int  # where this part stopped last run (0: at the start)
    report: ReconcileReport  # the part fills its own fields


PartRun = Callable[[PartContext], "int | None"]  # returns the cursor to keep for the next run, or None to keep none


@dataclass(frozen=True, kw_only=True)
class ReconcilePart:
    name: str
    run: PartRun


@dataclass(frozen=True, kw_only=True)
class Feature:
    name: str
    # the module holding its API: `router` (a Powertools Router) and `RULES` ({(method, path): api.rules.Rule});
    # imported by the API function only (the writer, reconciler and drainers never load Powertools' resolver)
    routes: str | None = None
    # built on first use, in the process that needs them (the services come from hotledger.runtime)
    persisters: Callable[[], dict[type, Any]] = dict  # event class -> its persister (outbox.writer.Persister)
    reconcile_parts: Callable[[], tuple[ReconcilePart, ...]] = tuple
    delay_handlers: Callable[[], dict[str, Callable[[list[str]], Any]]] = dict  # queue -> handler of due elements


def expiry_part(
    name: str,
    overdue: Callable[[int, int, int], list[tuple[int, int]]],
    end: Callable[[int, int], bool],
    grace_ms: Callable[[], int],
    counted: str,
) -> ReconcilePart:
    """A part ending what expired (a hold, a grant) more than grace_ms ago and is still open in the DB: its delay
    element was lost. overdue(before_ms, after_id, limit) -> [(user_id, id)] by id; end(user_id, id) -> ended now;
    `counted` names the report's field of how many ended."""

    def run(ctx: PartContext) -> int:
        after, ended = ctx.cursor, 0
        while not ctx.budget.exhausted:
            due = overdue(ctx.now_ms - grace_ms(), after, ctx.budget.page(100))
            if not due:
                return 0
            for user_id, entity_id in due:
                ended += end(user_id, entity_id)
            ctx.budget.spend(len(due))
            after = due[-1][1]
            setattr(ctx.report, counted, ended)
        return after

    return ReconcilePart(name=name, run=run)


def registered() -> tuple[Feature, ...]:
    """Every feature, in the order the API matches routes (the hot routes first) and the reconciler runs parts."""
    from hotledger.grants.feature import FEATURE as grants
    from hotledger.history.feature import FEATURE as history
    from hotledger.holds.feature import FEATURE as holds
    from hotledger.ledger.feature import FEATURE as ledger
    from hotledger.monitors.feature import FEATURE as monitors
    from hotledger.notices.feature import FEATURE as notices
    from hotledger.ops.feature import FEATURE as ops
    from hotledger.redpackets.feature import FEATURE as redpackets
    from hotledger.refunds.feature import FEATURE as refunds
    from hotledger.transfers.feature import FEATURE as transfers
    from hotledger.vouchers.feature import FEATURE as vouchers
    from hotledger.webhooks.feature import FEATURE as webhooks

    return (
        ledger,
        holds,
        grants,
        refunds,
        history,
        vouchers,
        redpackets,
        transfers,
        notices,
        webhooks,
        monitors,
        ops,
        KEYS,
    )


@dataclass
class PruneKeys:
    """The keys part: Idempotency-Key and rollback records older than retention_ms deleted (dal/retention.py)."""

    retention_ms: int

    def __call__(self, run: PartContext) -> None:
        from hotledger.dal import retention

        run.report.keys_pruned = sum(retention.prune(run.now_ms - self.retention_ms, run.budget).values())


def _prune_keys_part() -> tuple[ReconcilePart, ...]:
    from hotledger.config import settings

    return (ReconcilePart(name="keys", run=PruneKeys(settings().key_retention_days * 86_400_000)),)


# Idempotency-Key and rollback records of every feature, deleted past KEY_RETENTION_DAYS (dal/retention.py)
KEYS = Feature(name="keys", reconcile_parts=_prune_keys_part)
