"""Payment orders with a close time, and their close reminders (the seed's use of the delay queue).

Creating a payment order offers its id to the delay queue REMINDER_QUEUE, due REMINDER_BEFORE_CLOSE_S before
the close time (never before now); paying (a ledger deduct, Idempotency-Key payorder<id>) or closing, each
under the payment order's distributed lock, removes it. When it fires, the drainer hands the ids to
fire_reminders, which writes one inbox message per payment order still open: reminded_at in the DB (and the
inbox's (biz_type, outer_biz_id) record) make a redelivered reminder write nothing twice. The queue lives in
Redis: after a Redis loss the reconciler offers again the reminder of every open payment order not reminded
yet (reoffer_lost_reminders).

At its close time a payment order still open is closed: the queue CLOSE_QUEUE fires close_due, and the
reconciler closes any open payment order past its close time that the queue lost (close_overdue).
A paid payment order is never closed and a closed one never paid.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Protocol

from hotledger import errors
from hotledger.notices.store import PaymentOrder, PaymentOrderState, PaymentOrderStore

# the queue names are stored in Redis and reserved in the HTTP API: they keep their seed names
REMINDER_QUEUE = "order-close-reminder"
CLOSE_QUEUE = "order-close"
PAGE = 500
# user-facing texts (error messages, the reminder) keep the seed's word "order"
REMINDER_BIZ_TYPE = "ORDER_CLOSE_REMINDER"


class Ledger(Protocol):
    """What payment orders use of the ledger's service."""

    def account_exists(self, user_id: int) -> bool: ...

    def deduct(self, user_id: int, amount: int, idem_key: str | None = None): ...  # a result with its entry_id


def _now_ms() -> int:
    return int(time.time() * 1000)


class PaymentOrders:
    def __init__(self, store: PaymentOrderStore, ledger: Ledger, delay_queue, inbox, ids, lock, reminder_before_close_s: int,
                 now_ms: Callable[[], int] = _now_ms):
        self.store, self.ledger, self.queue, self.inbox, self.ids, self.lock = store, ledger, delay_queue, inbox, ids, lock
        self.reminder_before_close_ms = reminder_before_close_s * 1000
        self.now_ms = now_ms

    def create(self, user_id: int, amount: int, close_in_s: int) -> PaymentOrder:
        if not self.ledger.account_exists(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        payment_order_id, now = self.ids.next_id(), self.now_ms()
        close_at = now + close_in_s * 1000
        due = max(now, close_at - self.reminder_before_close_ms)
        payment_order = PaymentOrder(payment_order_id, user_id, amount, PaymentOrderState.OPEN, close_at, due)
        self.store.insert(payment_order)
        self.queue.offer(REMINDER_QUEUE, str(payment_order_id), due_at_ms=due)
        self.queue.offer(CLOSE_QUEUE, str(payment_order_id), due_at_ms=close_at)
        return payment_order

    def get(self, payment_order_id: int) -> PaymentOrder:
        """The payment order, with its reminder's due time while the reminder is queued."""
        return dataclasses.replace(self._load(payment_order_id),
                                   reminder_due_at=self.queue.due_at(REMINDER_QUEUE, str(payment_order_id)))

    def _load(self, payment_order_id: int) -> PaymentOrder:
        payment_order = self.store.get(payment_order_id)
        if payment_order is None:
            raise errors.PaymentOrderNotFound(f"order {payment_order_id} does not exist")
        return payment_order

    def pay(self, payment_order_id: int) -> PaymentOrder:
        """Deduct the amount (idempotent by key) under the payment order's lock, so a concurrent close cannot slip
        in between the payment and the state change (the deduct runs its own DB work, so no DB transaction is
        held across it). Paying a paid payment order answers PAID again."""
        with self.lock.hold(f"payment-order-{payment_order_id}"):
            payment_order = self._load(payment_order_id)
            if payment_order.state is PaymentOrderState.CLOSED:
                raise errors.PaymentOrderClosed(f"order {payment_order_id} is closed")
            if payment_order.state is PaymentOrderState.OPEN:
                if self.now_ms() >= payment_order.close_at:
                    raise errors.PaymentOrderClosed(f"order {payment_order_id} passed its close time")
                paid = self.ledger.deduct(payment_order.user_id, payment_order.amount, f"payorder{payment_order_id}")
                self.store.mark_paid(payment_order_id, paid.entry_id)
        self._unqueue(payment_order_id)
        return dataclasses.replace(payment_order, state=PaymentOrderState.PAID)

    def close(self, payment_order_id: int) -> PaymentOrder:
        """Closing a closed payment order answers CLOSED again."""
        with self.lock.hold(f"payment-order-{payment_order_id}"):
            payment_order = self._load(payment_order_id)
            if payment_order.state is PaymentOrderState.PAID:
                raise errors.PaymentOrderPaid(f"order {payment_order_id} is paid")
            self.store.mark_closed(payment_order_id)
        self._unqueue(payment_order_id)
        return dataclasses.replace(payment_order, state=PaymentOrderState.CLOSED)

    def _unqueue(self, payment_order_id: int) -> None:
        self.queue.remove(REMINDER_QUEUE, str(payment_order_id))
        self.queue.remove(CLOSE_QUEUE, str(payment_order_id))

    def close_due(self, payment_order_ids: list[str]) -> None:
        """Delay-queue handler: close the payment orders still open at their close time (under the lock, like a
        payment, so a payment that checked the time just before cannot be overtaken)."""
        for payment_order_id in payment_order_ids:
            try:
                self.close(int(payment_order_id))
            except (errors.PaymentOrderPaid, errors.PaymentOrderNotFound):
                pass  # paid meanwhile, or not ours: nothing to close

    def close_overdue(self, now_ms: int) -> int:
        """Close the open payment orders past their close time whose CLOSE_QUEUE element Redis lost."""
        overdue = self.store.open_past_close(now_ms, PAGE)
        self.close_due([str(payment_order_id) for payment_order_id in overdue])
        return len(overdue)

    def fire_reminders(self, payment_order_ids: list[str]) -> None:
        """Delay-queue handler: one inbox message per payment order still open, not reminded yet and not past its
        close time, then reminded_at; a crash in between is redelivered and the inbox's idempotency holds."""
        now = self.now_ms()
        due = [p for p in self.store.get_many([int(i) for i in payment_order_ids]) if p.awaits_reminder(now)]
        for payment_order in due:
            minutes = max(1, math.ceil((payment_order.close_at - now) / 60_000))
            self.inbox.post(payment_order.user_id, REMINDER_BIZ_TYPE, str(payment_order.id), "Payment reminder",
                            f"Your order {payment_order.id} closes in {minutes} minutes: pay now so it is not closed.")
        if due:
            self.store.mark_reminded([payment_order.id for payment_order in due], now)

    def reoffer_lost_reminders(self, now_ms: int) -> int:
        """Offer again, at their due time, the reminders of open payment orders that are neither reminded nor
        queued (Redis lost them). One paid or closed meanwhile gets a reminder that fires into nothing."""
        offered, after = 0, 0
        while True:
            page = self.store.unreminded(now_ms, after, PAGE)
            if not page:
                return offered
            due = {str(payment_order_id): remind_at for payment_order_id, remind_at in page}
            for payment_order_id in self.queue.absent(REMINDER_QUEUE, list(due)):
                self.queue.offer(REMINDER_QUEUE, payment_order_id, due_at_ms=due[payment_order_id])
                offered += 1
            after = page[-1][0]
