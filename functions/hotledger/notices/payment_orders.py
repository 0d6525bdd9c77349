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

Exactly once, through every window between the charge and the state change (a crash, an OUTCOME_UNKNOWN, a lost
lease). The charge is the truth, as in Stripe, where a PaymentIntent whose charge succeeded is succeeded and a
cancel of it is refused: pay and close both look for the ledger entry charged with the key payorder<id> (in
Redis while pending, in the DB once persisted: never only the key's 24 h idempotency record, while a payment
order lives up to 30 days), and a charge found settles the order PAID (close answers ORDER_PAID). The order's
lock is fenced like the account lock: every owner takes the row with its fencing token first (a smaller token is
refused), and only the owner whose token the row holds may close it. A pay marks pay_started_at before it
charges; a close finds no charge, yet a pay began within the payment horizon (the ledger's own bound on a live
request), waits (retryable 503), since that pay may still charge. A pay whose lease ran out and whose charge
landed after a newer owner closed the order all the same refunds it (ledger recharge, key payorderrefund<id>) and
answers ORDER_CLOSED.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from hotledger import errors
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.ledger.entry import ServiceKey
from hotledger.ledger.kinds import KIND_DEDUCT
from hotledger.notices.inbox import Inbox
from hotledger.notices.store import PaymentOrder as PaymentOrder  # re-exported: the routes' view of one
from hotledger.notices.store import PaymentOrderState, PaymentOrderStore

if TYPE_CHECKING:
    from hotledger.dal.budget import Budget
    from hotledger.dal.delay_queue import DelayQueue
    from hotledger.dal.ids import IdGenerator
    from hotledger.dal.lock import DistributedLock, Holding
    from hotledger.ledger.service import KeyedCharge, LedgerResult

# the queue names are stored in Redis and reserved in the HTTP API: they keep their seed names
REMINDER_QUEUE = "order-close-reminder"
CLOSE_QUEUE = "order-close"
PAGE = 500
# user-facing texts (error messages, the reminder) keep the seed's word "order"
REMINDER_BIZ_TYPE = "ORDER_CLOSE_REMINDER"
RETRY_MS = 10_000  # a queue element that failed is offered again this much later, the others of its batch go on
PAY_HORIZON_MS = 20_000  # default of the payment horizon (notices/feature.py passes the ledger's)

log = logging.getLogger(__name__)


def pay_key(payment_order_id: int) -> ServiceKey:
    return ServiceKey(f"payorder{payment_order_id}")


def refund_key(payment_order_id: int) -> ServiceKey:
    return ServiceKey(f"payorderrefund{payment_order_id}")


class Ledger(Protocol):
    """What payment orders use of the ledger's service."""

    def account_exists(self, user_id: int) -> bool: ...

    def deduct(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult: ...

    def recharge(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult: ...

    def charged_with(self, kind: str, user_id: int, idem_key: str) -> KeyedCharge | None: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class PaymentOrders:
    def __init__(
        self,
        store: PaymentOrderStore,
        ledger: Ledger,
        delay_queue: DelayQueue,
        inbox: Inbox,
        ids: IdGenerator,
        lock: DistributedLock,
        reminder_before_close_s: int,
        now_ms: Callable[[], int] = _now_ms,
        pay_horizon_ms: int = PAY_HORIZON_MS,
    ) -> None:
        """pay_horizon_ms: longer than a live pay spends between pay_started_at and its charge's final fate (the
        ledger's bound on a live request between its charge and the broker's answer or its rollback)."""
        self.store, self.ledger, self.queue, self.inbox, self.ids, self.lock = (
            store,
            ledger,
            delay_queue,
            inbox,
            ids,
            lock,
        )
        self.reminder_before_close_ms = reminder_before_close_s * 1000
        self.now_ms, self.pay_horizon_ms = now_ms, pay_horizon_ms

    def create(
        self,
        user_id: int,
        amount: int,
        close_in_s: int,
        reserve: Callable[[int], object] | None = None,
        payment_order_id: int | None = None,
    ) -> PaymentOrder:
        """`reserve(id)` runs before any effect (an Idempotency-Key's recovery point); `payment_order_id`: the id an
        attempt that died under the same key reserved: that order, if it was inserted, is the answer (its queue
        elements offered again, in case the attempt died before offering them)."""
        if not self.ledger.account_exists(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        inserted = None if payment_order_id is None else self.store.get_created(payment_order_id)
        if inserted is not None:
            self._offer_or_leave_to_the_reconciler(inserted)
            return inserted
        payment_order_id, now = payment_order_id or self.ids.next_id(), self.now_ms()
        if reserve is not None:
            reserve(payment_order_id)
        close_at = now + close_in_s * 1000
        due = max(now, close_at - self.reminder_before_close_ms)
        payment_order = PaymentOrder(payment_order_id, user_id, amount, PaymentOrderState.OPEN, close_at, due)
        self.store.insert(payment_order)
        self._offer_or_leave_to_the_reconciler(payment_order)
        return payment_order

    def _offer_or_leave_to_the_reconciler(self, payment_order: PaymentOrder) -> None:
        """Queue the reminder and the close. The inserted row is the request's answer whatever happens here: if Redis
        cannot take them (the queues' shard failing over), the reconciler offers the reminder again
        (reoffer_lost_reminders) and closes the order past its close time (close_overdue); never a second order."""
        try:
            self.queue.offer(REMINDER_QUEUE, str(payment_order.id), due_at_ms=payment_order.reminder_due_at)
            self.queue.offer(CLOSE_QUEUE, str(payment_order.id), due_at_ms=payment_order.close_at)
        except RedisUnavailable:
            log.warning(
                "payment order created; its reminder and close left to the reconciler",
                extra={"payment_order_id": str(payment_order.id)},
                exc_info=True,
            )

    def get(self, payment_order_id: int) -> PaymentOrder:
        """The payment order, with its reminder's due time while the reminder is queued."""
        return dataclasses.replace(
            self._load(payment_order_id), reminder_due_at=self.queue.due_at(REMINDER_QUEUE, str(payment_order_id))
        )

    def _load(self, payment_order_id: int) -> PaymentOrder:
        payment_order = self.store.get(payment_order_id)
        if payment_order is None:
            raise errors.PaymentOrderNotFound(f"order {payment_order_id} does not exist")
        return payment_order

    def pay(self, payment_order_id: int) -> PaymentOrder:
        """Deduct the amount (key payorder<id>) under the payment order's lock, so a concurrent close cannot slip
        in between the payment and the state change (the deduct runs its own DB work, so no DB transaction is
        held across it). A charge made before (a crash or OUTCOME_UNKNOWN after it) is found and settled, never
        charged again. Paying a paid payment order answers PAID again."""
        with self.lock.hold(f"payment-order-{payment_order_id}") as held:
            payment_order = self._load(payment_order_id)
            if payment_order.state is PaymentOrderState.CLOSED:
                raise errors.PaymentOrderClosed(f"order {payment_order_id} is closed")
            if payment_order.state is PaymentOrderState.OPEN:
                self.store.claim(payment_order_id, held, paying_at=self.now_ms())
                charge = self._charge_of(payment_order)
                if charge is not None and self._stands(charge):
                    entry_id = charge.entry_id
                else:  # none, or pending and young: the deduct replays it by its key
                    entry_id = self._deduct(payment_order, held, past_close=charge is None)
                self._settle_paid(payment_order, entry_id)
        self._unqueue(payment_order_id)
        return dataclasses.replace(payment_order, state=PaymentOrderState.PAID)

    def _deduct(self, payment_order: PaymentOrder, held: Holding, past_close: bool) -> int:
        if past_close and self.now_ms() >= payment_order.close_at:
            self.store.pay_refused(payment_order.id, held)
            raise errors.PaymentOrderClosed(f"order {payment_order.id} passed its close time")
        if held.lost.is_set():
            raise errors.FencedOut("this request's hold on the order lock ran out; nothing was charged, retry")
        try:
            return self.ledger.deduct(payment_order.user_id, payment_order.amount, pay_key(payment_order.id)).entry_id
        except errors.DomainError as exc:
            if exc.status < 500:  # refused (402, 403, 409 ...): nothing charged, a close need not wait for it
                self.store.pay_refused(payment_order.id, held)
            raise  # OUTCOME_UNKNOWN and the like: the close waits the horizon out, then finds the charge or none

    def _settle_paid(self, payment_order: PaymentOrder, entry_id: int) -> None:
        """OPEN -> PAID by this charge. Found CLOSED: a newer owner closed it before the charge landed (this
        owner's lease ran out): the charge is given back, idempotently, and the answer is ORDER_CLOSED."""
        if self.store.mark_paid(payment_order.id, entry_id):
            return
        if self._load(payment_order.id).state is PaymentOrderState.PAID:
            return
        refund = self.ledger.recharge(payment_order.user_id, payment_order.amount, refund_key(payment_order.id))
        self.store.mark_refunded(payment_order.id, refund.entry_id)
        log.warning(
            "payment order charged after its close: refunded",
            extra={"order": payment_order.id, "charge": entry_id, "refund": refund.entry_id},
        )
        raise errors.PaymentOrderClosed(
            f"order {payment_order.id} was closed before its payment landed; the payment was refunded"
        )

    def _charge_of(self, payment_order: PaymentOrder) -> KeyedCharge | None:
        return self.ledger.charged_with(KIND_DEDUCT, payment_order.user_id, pay_key(payment_order.id))

    def _stands(self, charge: KeyedCharge) -> bool:
        """Persisted, or pending longer than any live request could still roll it back (a pending charge has its ts)."""
        return charge.persisted or (charge.ts is not None and self.now_ms() - charge.ts >= self.pay_horizon_ms)

    def close(self, payment_order_id: int) -> PaymentOrder:
        """Closing a closed payment order answers CLOSED again; one with a charge is settled PAID and answers
        ORDER_PAID (Stripe refuses to cancel a succeeded PaymentIntent); while a pay may still be charging,
        a retryable 503."""
        with self.lock.hold(f"payment-order-{payment_order_id}") as held:
            payment_order = self._load(payment_order_id)
            if payment_order.state is PaymentOrderState.PAID:
                raise errors.PaymentOrderPaid(f"order {payment_order_id} is paid")
            if payment_order.state is PaymentOrderState.OPEN:
                self.store.claim(payment_order_id, held)
                charge = self._charge_of(payment_order)
                in_flight = (charge is not None and not self._stands(charge)) or (
                    charge is None
                    and payment_order.pay_started_at is not None
                    and self.now_ms() - payment_order.pay_started_at < self.pay_horizon_ms
                )
                if in_flight:
                    raise errors.ServiceUnavailable(
                        f"a payment of order {payment_order_id} may still be in progress; "
                        "nothing was changed, retry in a few seconds"
                    )
                if charge is not None:
                    self._settle_paid(payment_order, charge.entry_id)
                    self._unqueue(payment_order_id)
                    raise errors.PaymentOrderPaid(f"order {payment_order_id} is paid (its payment was found)")
                if not self.store.mark_closed(payment_order_id, held):
                    if self._load(payment_order_id).state is PaymentOrderState.PAID:
                        raise errors.PaymentOrderPaid(f"order {payment_order_id} is paid")
                    raise errors.FencedOut(
                        "this request's hold on the order lock ran out and a newer one took the "
                        "order; nothing was changed, retry"
                    )
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
            except Exception:  # this one alone is tried again later; the rest of the batch goes on
                log.exception("payment order close failed; offered again", extra={"order": payment_order_id})
                self.queue.offer(CLOSE_QUEUE, str(payment_order_id), due_at_ms=self.now_ms() + RETRY_MS)

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
        reminded = []
        for payment_order in due:
            minutes = max(1, math.ceil((payment_order.close_at - now) / 60_000))
            try:
                self.inbox.post(
                    payment_order.user_id,
                    REMINDER_BIZ_TYPE,
                    str(payment_order.id),
                    "Payment reminder",
                    f"Your order {payment_order.id} closes in {minutes} minutes: pay now so it is not closed.",
                )
            except errors.AccountNotFound:
                log.warning("payment order reminder for a missing account dropped", extra={"order": payment_order.id})
            except Exception:  # this one alone is tried again later; the rest of the batch goes on
                log.exception("payment order reminder failed; offered again", extra={"order": payment_order.id})
                self.queue.offer(REMINDER_QUEUE, str(payment_order.id), due_at_ms=now + RETRY_MS)
                continue
            reminded.append(payment_order.id)
        if reminded:
            self.store.mark_reminded(reminded, now)

    def reoffer_lost_reminders(self, now_ms: int) -> int:
        """Offer again, at their due time, the reminders of open payment orders that are neither reminded nor
        queued (Redis lost them). One paid or closed meanwhile gets a reminder that fires into nothing."""
        return self.reoffer_lost_reminders_within(now_ms, None, 0)[0]

    def reoffer_lost_reminders_within(self, now_ms: int, budget: Budget | None, after: int) -> tuple[int, int]:
        """reoffer_lost_reminders for the orders after id `after`, page by page while `budget` (dal.budget.Budget,
        None: no limit) lasts; (reminders offered, the id the next run continues after, 0 when the last was reached)."""
        offered = 0
        while budget is None or not budget.exhausted:
            page = self.store.unreminded(now_ms, after, PAGE if budget is None else budget.page(PAGE))
            if not page:
                return offered, 0
            due = {str(payment_order_id): remind_at for payment_order_id, remind_at in page}
            for payment_order_id in self.queue.absent(REMINDER_QUEUE, list(due)):
                self.queue.offer(REMINDER_QUEUE, payment_order_id, due_at_ms=due[payment_order_id])
                offered += 1
            after = page[-1][0]
            if budget is not None:
                budget.spend(len(page))
        return offered, after
