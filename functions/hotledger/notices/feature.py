"""Payment orders, delay queues, the inbox and journeys: their registration (hotledger.features)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    payment_orders, journeys = runtime.payment_orders(), runtime.journeys()

    def journeys_part(run: PartContext) -> None:
        run.report.journeys = journeys.scan(run.now_ms)  # one page per journey kind: bounded already

    def reminders(run: PartContext) -> int:
        run.report.reminders_reoffered, run.report.reminders_next_after = payment_orders.reoffer_lost_reminders_within(
            run.now_ms, run.budget, run.cursor
        )
        return run.report.reminders_next_after

    def orders(run: PartContext) -> None:
        run.report.orders_closed = payment_orders.close_overdue(run.now_ms)  # one page: bounded already

    return (
        ReconcilePart(name="journeys", run=journeys_part),
        ReconcilePart(name="reminders", run=reminders),
        ReconcilePart(name="orders", run=orders),
    )


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.notices.payment_orders import CLOSE_QUEUE, REMINDER_QUEUE

    return {REMINDER_QUEUE: runtime.payment_orders().fire_reminders, CLOSE_QUEUE: runtime.payment_orders().close_due}


FEATURE = Feature(
    name="notices", routes="hotledger.notices.routes", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers
)
