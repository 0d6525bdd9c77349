"""Payment orders with a close time, and their order-close reminders (the seed's use of the delay queue).

Creating an order offers its id to the delay queue ORDER_REMINDERS, due REMINDER_BEFORE_CLOSE_S before
the close time; paying (a billing deduct, Idempotency-Key payorder<id>) or closing, each under the order's
distributed lock, removes it. When it
fires, the drainer hands the ids to fire_reminders, which writes one inbox message per order still open:
reminded_at in the DB (and the inbox's (biz_type, outer_biz_id) record) make a redelivered reminder write
nothing twice. The queue lives in Redis: after a Redis loss the reconciler offers again the reminder of every
open order not reminded yet (reoffer_lost_reminders).

At its close time an order still open is closed: the queue ORDER_CLOSES fires close_due, and the reconciler
closes any open order past its close time that the queue lost (close_overdue).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hotledger import errors
from hotledger.dal import db

ORDER_REMINDERS = "order-close-reminder"
ORDER_CLOSES = "order-close"
PAGE = 500
REMINDER_BIZ_TYPE = "ORDER_CLOSE_REMINDER"


@dataclass(frozen=True)
class PaymentOrder:
    order_id: int
    user_id: int
    amount: int
    state: str
    close_at: int
    reminder_due_at: int | None = None


class PaymentOrders:
    def __init__(self, billing, delay_queue, inbox, ids, lock, reminder_before_close_s: int):
        self.billing, self.queue, self.inbox, self.ids, self.lock = billing, delay_queue, inbox, ids, lock
        self.reminder_before_close_ms = reminder_before_close_s * 1000

    def create(self, user_id: int, amount: int, close_in_s: int) -> PaymentOrder:
        if not self.billing.account_exists(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        order_id, now = self.ids.next_id(), int(time.time() * 1000)
        close_at = now + close_in_s * 1000
        due = max(now, close_at - self.reminder_before_close_ms)
        db.execute("INSERT INTO t_payment_order (id, user_id, amount, state, close_at, remind_at)"
                   " VALUES (%s, %s, %s, 'OPEN', %s, %s)",
                   (order_id, user_id, amount, db.to_datetime(close_at), db.to_datetime(due)))
        self.queue.offer(ORDER_REMINDERS, str(order_id), due_at_ms=due)
        self.queue.offer(ORDER_CLOSES, str(order_id), due_at_ms=close_at)
        return PaymentOrder(order_id, user_id, amount, "OPEN", close_at, due)

    def get(self, order_id: int) -> PaymentOrder:
        rows = db.query("SELECT user_id, amount, state, close_at FROM t_payment_order WHERE id = %s", (order_id,))
        if not rows:
            raise errors.PaymentOrderNotFound(f"order {order_id} does not exist")
        user_id, amount, state, close_at = rows[0]
        return PaymentOrder(order_id, user_id, amount, state, db.to_ms(close_at), self.queue.due_at(ORDER_REMINDERS, str(order_id)))

    def pay(self, order_id: int) -> PaymentOrder:
        """Deduct the amount (idempotent by key) under the order's lock, so a concurrent close cannot slip in
        between the payment and the state change (the deduct runs its own DB work, so no DB transaction is
        held across it)."""
        with self.lock.hold(f"payment-order-{order_id}"):
            order = self.get(order_id)
            if order.state == "CLOSED":
                raise errors.OrderClosed(f"order {order_id} is closed")
            if order.state == "OPEN":
                if int(time.time() * 1000) >= order.close_at:
                    raise errors.OrderClosed(f"order {order_id} passed its close time")
                paid = self.billing.deduct(order.user_id, order.amount, f"payorder{order_id}")
                db.execute("UPDATE t_payment_order SET state = 'PAID', deduct_order_id = %s WHERE id = %s AND state = 'OPEN'",
                           (paid.entry_id, order_id))
        self._unqueue(order_id)
        return PaymentOrder(order_id, order.user_id, order.amount, "PAID", order.close_at)

    def close(self, order_id: int) -> PaymentOrder:
        with self.lock.hold(f"payment-order-{order_id}"):
            order = self.get(order_id)
            if order.state == "PAID":
                raise errors.OrderPaid(f"order {order_id} is paid")
            db.execute("UPDATE t_payment_order SET state = 'CLOSED' WHERE id = %s AND state = 'OPEN'", (order_id,))
        self._unqueue(order_id)
        return PaymentOrder(order_id, order.user_id, order.amount, "CLOSED", order.close_at)

    def _unqueue(self, order_id: int) -> None:
        self.queue.remove(ORDER_REMINDERS, str(order_id))
        self.queue.remove(ORDER_CLOSES, str(order_id))

    def close_due(self, order_ids: list[str]) -> None:
        """Delay-queue handler: close the orders still open at their close time (under the order's lock, like a
        payment, so a payment that checked the time just before cannot be overtaken)."""
        for order_id in order_ids:
            try:
                self.close(int(order_id))
            except (errors.OrderPaid, errors.PaymentOrderNotFound):
                pass  # paid meanwhile, or not ours: nothing to close

    def close_overdue(self, now_ms: int) -> int:
        """Close the open orders past their close time whose ORDER_CLOSES element Redis lost."""
        overdue = db.query("SELECT id FROM t_payment_order WHERE state = 'OPEN' AND close_at <= %s ORDER BY close_at LIMIT %s",
                           (db.to_datetime(now_ms), PAGE))
        self.close_due([str(order_id) for (order_id,) in overdue])
        return len(overdue)

    def fire_reminders(self, order_ids: list[str]) -> None:
        """Delay-queue handler: one inbox message per order still open, not reminded yet and not past its close
        time, then reminded_at; a crash in between is redelivered and the inbox's idempotency holds."""
        now = int(time.time() * 1000)
        rows = db.query(f"SELECT id, user_id, close_at FROM t_payment_order WHERE state = 'OPEN' AND reminded_at IS NULL"
                        f" AND close_at > %s AND id IN ({','.join(['%s'] * len(order_ids))})",
                        [db.to_datetime(now), *(int(i) for i in order_ids)])
        for order_id, user_id, close_at in rows:
            minutes = max(1, math.ceil((db.to_ms(close_at) - now) / 60_000))
            self.inbox.post(user_id, REMINDER_BIZ_TYPE, str(order_id), "Payment reminder",
                            f"Your order {order_id} closes in {minutes} minutes: pay now so it is not closed.")
        if rows:
            db.execute(f"UPDATE t_payment_order SET reminded_at = %s WHERE id IN ({','.join(['%s'] * len(rows))})",
                       [db.to_datetime(now), *(row[0] for row in rows)])

    def reoffer_lost_reminders(self, now_ms: int) -> int:
        """Offer again, at their due time, the reminders of open orders that are neither reminded nor queued
        (Redis lost them). An order paid or closed meanwhile gets a reminder that fires into nothing."""
        offered, after = 0, 0
        while True:
            rows = db.query("SELECT id, COALESCE(remind_at, create_time) FROM t_payment_order WHERE state = 'OPEN'"
                            " AND reminded_at IS NULL AND close_at > %s AND id > %s ORDER BY id LIMIT %s",
                            (db.to_datetime(now_ms), after, PAGE))
            if not rows:
                return offered
            due = {str(order_id): db.to_ms(remind_at) for order_id, remind_at in rows}
            for order_id in self.queue.absent(ORDER_REMINDERS, list(due)):
                self.queue.offer(ORDER_REMINDERS, order_id, due_at_ms=due[order_id])
                offered += 1
            after = rows[-1][0]
