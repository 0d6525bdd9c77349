"""Balance monitors' registration (hotledger.features): routes, and the reconciler part that posts crossings to the
user's inbox (the crossings themselves are judged with the ledger's bookings: monitors.store.judge)."""

from __future__ import annotations

from hotledger.features import Feature, PartContext, ReconcilePart


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    monitors = runtime.monitors()

    def alerts(run: PartContext) -> None:
        run.report.alerts_posted = monitors.post_alerts(run.budget)

    return (ReconcilePart(name="alerts", run=alerts),)


FEATURE = Feature(name="monitors", routes="hotledger.monitors.routes", reconcile_parts=_reconcile_parts)
