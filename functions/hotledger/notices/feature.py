"""Payment orders, delay queues, the inbox and journeys: their registration (hotledger.features) and services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import lua
from hotledger.features import Feature
from hotledger.ledger.feature import ledger, ledger_store
from hotledger.notices.inbox import Inbox
from hotledger.notices.journeys import Journeys, parse_thresholds
from hotledger.notices.payment_orders import CLOSE_QUEUE, REMINDER_QUEUE, PaymentOrders
from hotledger.notices.store import InboxStore, JourneyStore, PaymentOrderStore
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.runtime import delay_queue, id_generator, lock, service


@service
def inbox() -> Inbox:
    cfg = settings()
    return Inbox(InboxStore(lua()), id_generator(), cfg.inbox_ttl_s, cfg.inbox_max_messages, ledger().account_exists)


@service
def payment_orders() -> PaymentOrders:
    return PaymentOrders(
        PaymentOrderStore(),
        ledger(),
        delay_queue(),
        inbox(),
        id_generator(),
        lock(),
        settings().reminder_before_close_s,
        pay_horizon_ms=ledger_store().idempotency_stale_ms,
    )


@service
def journeys() -> Journeys:
    return Journeys(JourneyStore(lua()), inbox(), parse_thresholds(settings().journeys))


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    orders_service, journeys_service = payment_orders(), journeys()

    def journeys_part(run: PartContext) -> None:
        run.report.journeys = journeys_service.scan(run.now_ms)  # one page per journey kind: bounded already

    def reminders(run: PartContext) -> int:
        run.report.reminders_reoffered, run.report.reminders_next_after = orders_service.reoffer_lost_reminders_within(
            run.now_ms, run.budget, run.cursor
        )
        return run.report.reminders_next_after

    def orders(run: PartContext) -> None:
        run.report.orders_closed = orders_service.close_overdue(run.now_ms)  # one page: bounded already

    return (
        ReconcilePart(name="journeys", run=journeys_part),
        ReconcilePart(name="reminders", run=reminders),
        ReconcilePart(name="orders", run=orders),
    )


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    return {REMINDER_QUEUE: payment_orders().fire_reminders, CLOSE_QUEUE: payment_orders().close_due}


FEATURE = Feature(
    name="notices", routes="hotledger.notices.routes", reconcile_parts=_reconcile_parts, delay_handlers=_delay_handlers
)
