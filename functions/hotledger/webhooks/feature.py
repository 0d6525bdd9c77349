"""Webhooks' registration (hotledger.features): routes, and the reconciler part that enforces their retention; the
deliveries are written with the ledger's bookings (webhooks.store.enqueue) and sent by the webhook sender function
(functions/webhook_sender)."""

from __future__ import annotations

from hotledger.features import Feature, PartContext, ReconcilePart


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime
    from hotledger.config import settings

    retention_ms = settings().webhook_retention_days * 86_400_000

    def prune(run: PartContext) -> None:
        run.report.webhooks_pruned = runtime.webhooks().store.prune(run.now_ms - retention_ms, run.budget)

    return (ReconcilePart(name="webhooks", run=prune),)


FEATURE = Feature(name="webhooks", routes="hotledger.webhooks.routes", reconcile_parts=_reconcile_parts)
