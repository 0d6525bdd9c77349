"""Balance monitors' registration (hotledger.features) and service: routes; the crossings, judged with every booking
in its transaction (its subscriber, monitors.store.judge); and the reconciler part that posts them to the user's
inbox."""

from __future__ import annotations

from hotledger.features import Feature
from hotledger.ledger.feature import ledger
from hotledger.ledger.tx import Booking
from hotledger.monitors.service import Monitors
from hotledger.monitors.store import MonitorStore, judge
from hotledger.notices.feature import inbox
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.runtime import currencies, service


@service
def monitors() -> Monitors:
    return Monitors(MonitorStore(), inbox(), ledger().account_exists, formatter=lambda u: currencies().of(u).format)


def _judge(booking: Booking) -> None:
    """The booked accounts' monitors fire and re-arm; their crossings go on to the later subscribers (webhooks)."""
    booking.raised.extend(judge(booking.cursor, booking.rows))


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    monitors_service = monitors()

    def alerts(run: PartContext) -> None:
        run.report.alerts_posted = monitors_service.post_alerts(run.budget)

    return (ReconcilePart(name="alerts", run=alerts),)


FEATURE = Feature(
    name="monitors", routes="hotledger.monitors.routes", reconcile_parts=_reconcile_parts, on_booked=_judge
)
