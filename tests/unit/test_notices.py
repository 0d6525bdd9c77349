"""Notices' decisions with in-memory fakes (no server): payment orders and their close reminders, the inbox's
duplicate detection, journeys, and the delay queue's drainer, element encoding and script replies."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest

from hotledger import errors
from hotledger.dal import delay_queue as dq
from hotledger.dal.delay_queue import NO_TIME, Drainer, Taken, canonical
from hotledger.dal.lock import AcquireReply, AcquireStatus, Holding
from hotledger.ledger.service import KeyedCharge
from hotledger.notices import payment_orders as po
from hotledger.notices.inbox import Inbox
from hotledger.notices.journeys import DEFAULT_TEXT, TEXTS, Journeys, parse_thresholds
from hotledger.notices.payment_orders import CLOSE_QUEUE, REMINDER_QUEUE, PaymentOrders
from hotledger.notices.store import PaymentOrder, PaymentOrderState, PostReply, PostStatus

OPEN, PAID, CLOSED = PaymentOrderState.OPEN, PaymentOrderState.PAID, PaymentOrderState.CLOSED
NOW = 1_800_000_000_000
MINUTE = 60_000
USER = 7
HORIZON = 20_000


# fakes -----------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self, now: int = NOW):
        self.now = now

    def __call__(self) -> int:
        return self.now


class Ids:
    def __init__(self, start: int = 1000):
        self.last = start

    def next_id(self) -> int:
        self.last += 1
        return self.last


class FakeLock:
    """Each hold is a new owner with the next fencing token."""

    def __init__(self):
        self.held: list[str] = []
        self.holding: str | None = None
        self.fence = 0

    @contextlib.contextmanager
    def hold(self, name: str):
        self.held.append(name)
        self.holding = name
        self.fence += 1
        try:
            yield Holding(name, "owner", self.fence)
        finally:
            self.holding = None


@dataclasses.dataclass
class Deducted:
    entry_id: int


class FakeLedger:
    def __init__(self, lock: FakeLock, accounts=(USER,)):
        self.lock, self.accounts, self.deducts, self.recharges = lock, set(accounts), [], []
        self.pending: dict[str, tuple[int, int]] = {}

    def account_exists(self, user_id: int) -> bool:
        return user_id in self.accounts

    def deduct(self, user_id: int, amount: int, idem_key: str) -> Deducted:
        self.deducts.append((user_id, amount, idem_key, self.lock.holding))
        return Deducted(entry_id=500 + len(self.deducts))

    def recharge(self, user_id: int, amount: int, idem_key: str) -> Deducted:
        self.recharges.append((user_id, amount, idem_key))
        return Deducted(entry_id=900 + len(self.recharges))

    def charged_with(self, kind: str, user_id: int, idem_key: str) -> KeyedCharge | None:
        """The charges the fake made, persisted; `pending` holds those still in Redis: key -> (entry id, ts)."""
        if idem_key in self.pending:
            entry_id, ts = self.pending[idem_key]
            return KeyedCharge(entry_id, persisted=False, ts=ts)
        made = [n for n, d in enumerate(self.deducts, 1) if (d[0], d[2]) == (user_id, idem_key)]
        return KeyedCharge(500 + made[0], persisted=True) if kind == "D" and made else None


class FakeQueue:
    def __init__(self):
        self.queues: dict[str, dict[str, int]] = {}
        self.taken: dict[str, set[str]] = {}

    def offer(self, queue: str, element, due_at_ms: int) -> bool:
        items = self.queues.setdefault(queue, {})
        new = element not in items
        items[element] = due_at_ms
        return new

    def remove(self, queue: str, element) -> bool:
        return self.queues.get(queue, {}).pop(element, None) is not None

    def due_at(self, queue: str, element) -> int | None:
        return self.queues.get(queue, {}).get(element)

    def absent(self, queue: str, elements: list) -> list:
        return [e for e in elements if e not in self.queues.get(queue, {}) and e not in self.taken.get(queue, set())]


class FakePaymentOrderStore:
    def __init__(self):
        self.rows: dict[int, PaymentOrder] = {}
        self.remind_at: dict[int, int] = {}
        self.paid_by: dict[int, int] = {}
        self.reminded_at: dict[int, int] = {}
        self.fences: dict[int, int] = {}
        self.refunded_by: dict[int, int] = {}

    def add(
        self, payment_order_id: int, state=OPEN, close_at=NOW + 60 * MINUTE, reminded=False, user_id=USER, amount=500
    ):
        self.rows[payment_order_id] = PaymentOrder(
            payment_order_id, user_id, amount, state, close_at, reminded=reminded
        )

    def insert(self, payment_order: PaymentOrder) -> None:
        self.rows[payment_order.id] = dataclasses.replace(payment_order, reminder_due_at=None)
        self.remind_at[payment_order.id] = payment_order.reminder_due_at

    def get(self, payment_order_id: int) -> PaymentOrder | None:
        return self.rows.get(payment_order_id)

    def get_many(self, payment_order_ids: list[int]) -> list[PaymentOrder]:
        return [self.rows[i] for i in payment_order_ids if i in self.rows]

    def _move(self, payment_order_id: int, state: PaymentOrderState) -> None:
        row = self.rows[payment_order_id]
        if row.state is OPEN:
            self.rows[payment_order_id] = dataclasses.replace(row, state=state)

    def claim(self, payment_order_id: int, held, paying_at: int | None = None) -> None:
        if self.fences.get(payment_order_id, 0) > held.fence:
            raise errors.FencedOut("newer owner")
        self.fences[payment_order_id] = held.fence
        if paying_at is not None:
            self.rows[payment_order_id] = dataclasses.replace(self.rows[payment_order_id], pay_started_at=paying_at)

    def pay_refused(self, payment_order_id: int, held) -> None:
        if self.fences.get(payment_order_id) == held.fence:
            self.rows[payment_order_id] = dataclasses.replace(self.rows[payment_order_id], pay_started_at=None)

    def _move(self, payment_order_id: int, state: PaymentOrderState) -> bool:
        row = self.rows[payment_order_id]
        if row.state is OPEN:
            self.rows[payment_order_id] = dataclasses.replace(row, state=state)
            return True
        return False

    def mark_paid(self, payment_order_id: int, deduct_entry_id: int) -> bool:
        if self._move(payment_order_id, PAID):
            self.paid_by[payment_order_id] = deduct_entry_id
            return True
        return False

    def mark_closed(self, payment_order_id: int, held) -> bool:
        return self.fences.get(payment_order_id) == held.fence and self._move(payment_order_id, CLOSED)

    def mark_refunded(self, payment_order_id: int, refund_entry_id: int) -> None:
        self.refunded_by[payment_order_id] = refund_entry_id

    def open_past_close(self, now_ms: int, limit: int) -> list[int]:
        return [r.id for r in self.rows.values() if r.state is OPEN and r.close_at <= now_ms][:limit]

    def mark_reminded(self, payment_order_ids: list[int], now_ms: int) -> None:
        for i in payment_order_ids:
            self.rows[i] = dataclasses.replace(self.rows[i], reminded=True)
            self.reminded_at[i] = now_ms

    def unreminded(self, now_ms: int, after_id: int, limit: int) -> list[tuple[int, int]]:
        return [
            (r.id, self.remind_at.get(r.id, 0))
            for r in sorted(self.rows.values(), key=lambda r: r.id)
            if r.id > after_id and r.awaits_reminder(now_ms)
        ][:limit]


class FakeInbox:
    def __init__(self, accounts=(USER,)):
        self.accounts, self.posts, self.failing = set(accounts), [], set()

    def account_exists(self, account: int) -> bool:
        return account in self.accounts

    def post(self, account, biz_type, outer_biz_id, title, content, url=None):
        if account not in self.accounts:
            raise errors.AccountNotFound(f"account {account} does not exist")
        if outer_biz_id in self.failing:
            raise errors.ServiceUnavailable("Redis is unreachable")
        self.posts.append((account, biz_type, outer_biz_id, title, content, url))


@pytest.fixture
def world():
    lock = FakeLock()
    clock, store, queue, inbox, ledger = Clock(), FakePaymentOrderStore(), FakeQueue(), FakeInbox(), FakeLedger(lock)
    service = PaymentOrders(
        store, ledger, queue, inbox, Ids(), lock, reminder_before_close_s=15 * 60, now_ms=clock, pay_horizon_ms=HORIZON
    )
    return dataclasses.make_dataclass("World", ["service", "store", "queue", "inbox", "ledger", "lock", "clock"])(
        service, store, queue, inbox, ledger, lock, clock
    )


# payment orders ------------------------------------------------------------------------------------------
def test_create_queues_the_reminder_before_the_close_time_and_the_close_at_it(world):
    created = world.service.create(USER, 1234, close_in_s=3600)
    close_at = NOW + 3_600_000
    assert (created.state, created.close_at, created.reminder_due_at) == (OPEN, close_at, close_at - 15 * MINUTE)
    assert world.store.rows[created.id].amount == 1234 and world.store.remind_at[created.id] == close_at - 15 * MINUTE
    assert world.queue.queues == {
        REMINDER_QUEUE: {str(created.id): close_at - 15 * MINUTE},
        CLOSE_QUEUE: {str(created.id): close_at},
    }


def test_a_reminder_is_never_due_before_now(world):
    created = world.service.create(USER, 100, close_in_s=60)  # closes sooner than the reminder lead time
    assert created.reminder_due_at == NOW == world.store.remind_at[created.id]
    assert world.queue.due_at(REMINDER_QUEUE, str(created.id)) == NOW
    assert world.queue.due_at(CLOSE_QUEUE, str(created.id)) == NOW + 60_000


def test_create_for_an_unknown_account_stores_and_queues_nothing(world):
    with pytest.raises(errors.AccountNotFound):
        world.service.create(999, 100, close_in_s=60)
    assert world.store.rows == {} and world.queue.queues == {}


def test_pay_deducts_once_under_the_lock_and_unqueues(world):
    created = world.service.create(USER, 700, close_in_s=3600)
    paid = world.service.pay(created.id)
    assert (paid.state, paid.reminder_due_at) == (PAID, None)
    assert world.ledger.deducts == [(USER, 700, f"payorder{created.id}", f"payment-order-{created.id}")]
    assert world.store.rows[created.id].state is PAID and world.store.paid_by[created.id] == 501
    assert world.queue.due_at(REMINDER_QUEUE, str(created.id)) is None
    assert world.queue.due_at(CLOSE_QUEUE, str(created.id)) is None
    assert world.service.pay(created.id).state is PAID  # paying again answers PAID, charges nothing more
    assert len(world.ledger.deducts) == 1


def test_pay_refuses_a_closed_payment_order_and_one_past_its_close_time(world):
    world.store.add(1, state=CLOSED)
    world.store.add(2, close_at=NOW)  # its close time has come, the close not run yet
    world.store.add(3, close_at=NOW + 1)
    for payment_order_id in (1, 2):
        with pytest.raises(errors.PaymentOrderClosed):
            world.service.pay(payment_order_id)
    assert world.ledger.deducts == [] and world.store.rows[2].state is OPEN
    assert world.service.pay(3).state is PAID
    with pytest.raises(errors.PaymentOrderNotFound):
        world.service.pay(4)


def test_close_refuses_a_paid_payment_order_and_closes_an_open_one(world):
    world.store.add(1, state=PAID)
    created = world.service.create(USER, 100, close_in_s=3600)
    with pytest.raises(errors.PaymentOrderPaid):
        world.service.close(1)
    assert world.store.rows[1].state is PAID
    closed = world.service.close(created.id)
    assert closed.state is CLOSED and world.store.rows[created.id].state is CLOSED
    assert world.lock.held[-1] == f"payment-order-{created.id}"
    assert world.queue.absent(REMINDER_QUEUE, [str(created.id)]) == [str(created.id)]
    assert world.queue.absent(CLOSE_QUEUE, [str(created.id)]) == [str(created.id)]
    assert world.service.close(created.id).state is CLOSED  # again: same answer


def test_get_reports_the_reminder_due_time_while_queued(world):
    created = world.service.create(USER, 100, close_in_s=3600)
    assert world.service.get(created.id).reminder_due_at == created.reminder_due_at
    world.queue.remove(REMINDER_QUEUE, str(created.id))
    assert world.service.get(created.id).reminder_due_at is None
    with pytest.raises(errors.PaymentOrderNotFound):
        world.service.get(created.id + 1)


def test_close_due_skips_paid_and_unknown_payment_orders(world):
    world.store.add(1)
    world.store.add(2, state=PAID)
    world.store.add(3, state=CLOSED)
    world.service.close_due(["1", "2", "42", "3"])  # no error: the handler acknowledges the whole batch
    assert [world.store.rows[i].state for i in (1, 2, 3)] == [CLOSED, PAID, CLOSED]


def test_close_overdue_closes_the_open_payment_orders_past_their_close_time(world):
    world.store.add(1, close_at=NOW - 1)
    world.store.add(2, close_at=NOW + 1)
    world.store.add(3, state=PAID, close_at=NOW - 1)
    assert world.service.close_overdue(NOW) == 1
    assert [world.store.rows[i].state for i in (1, 2, 3)] == [CLOSED, OPEN, PAID]


def test_fire_reminders_writes_one_message_per_open_unreminded_payment_order(world):
    world.store.add(1, close_at=NOW + 60 * MINUTE)
    world.store.add(2, close_at=NOW + 90_001)  # 1.5 minutes and a bit: rounded up
    world.store.add(3, close_at=NOW + 10)  # under a minute: "1 minutes", never 0
    world.store.add(4, state=PAID)
    world.store.add(5, state=CLOSED)
    world.store.add(6, reminded=True)
    world.store.add(7, close_at=NOW)  # past its close time
    world.service.fire_reminders(["1", "2", "3", "4", "5", "6", "7", "8"])
    assert [(p[0], p[1], p[2], p[3]) for p in world.inbox.posts] == [
        (USER, "ORDER_CLOSE_REMINDER", str(i), "Payment reminder") for i in (1, 2, 3)
    ]
    assert [p[4] for p in world.inbox.posts] == [
        f"Your order {i} closes in {m} minutes: pay now so it is not closed." for i, m in ((1, 60), (2, 2), (3, 1))
    ]
    assert world.store.reminded_at == {1: NOW, 2: NOW, 3: NOW}
    world.service.fire_reminders(["1", "2"])  # redelivered: reminded_at holds
    assert len(world.inbox.posts) == 3


def test_reoffer_lost_reminders_offers_only_the_absent_ones_at_their_due_time(world, monkeypatch):
    monkeypatch.setattr(po, "PAGE", 2)  # three pages
    for i in range(1, 6):
        world.store.add(i)
        world.store.remind_at[i] = NOW + i * MINUTE
    world.store.add(6, reminded=True)
    world.store.add(7, state=PAID)
    world.queue.offer(REMINDER_QUEUE, "2", due_at_ms=NOW + 2 * MINUTE)  # still waiting
    world.queue.taken[REMINDER_QUEUE] = {"4"}  # taken, being handled
    assert world.service.reoffer_lost_reminders(NOW) == 3
    assert world.queue.queues[REMINDER_QUEUE] == {str(i): NOW + i * MINUTE for i in (1, 2, 3, 5)}
    assert world.service.reoffer_lost_reminders(NOW) == 0


# payment orders: exactly once through crashes, unknown outcomes and lost leases ---------------------------
def test_close_settles_a_persisted_charge_as_paid(world):
    created = world.service.create(USER, 700, close_in_s=3600)
    world.ledger.deduct(USER, 700, f"payorder{created.id}")  # charged, then the pay died before PAID
    with pytest.raises(errors.PaymentOrderPaid):
        world.service.close(created.id)
    assert world.store.rows[created.id].state is PAID and world.store.paid_by[created.id] == 501
    assert world.queue.due_at(CLOSE_QUEUE, str(created.id)) is None
    assert world.ledger.recharges == []


def test_close_waits_for_a_young_pending_charge_then_settles_it(world):
    world.store.add(1)
    world.ledger.pending["payorder1"] = (77, NOW - HORIZON + 1)  # a live pay could still roll it back
    with pytest.raises(errors.ServiceUnavailable):
        world.service.close(1)
    assert world.store.rows[1].state is OPEN
    world.clock.now += 1
    with pytest.raises(errors.PaymentOrderPaid):
        world.service.close(1)
    assert world.store.paid_by[1] == 77


def test_close_waits_out_the_horizon_of_a_pay_that_began(world):
    world.store.add(1)
    world.store.rows[1] = dataclasses.replace(world.store.rows[1], pay_started_at=NOW - HORIZON + 1)
    with pytest.raises(errors.ServiceUnavailable):
        world.service.close(1)
    world.clock.now += 1  # no charge came: nothing can come any more
    assert world.service.close(1).state is CLOSED


def test_pay_settles_a_charge_made_before_and_never_charges_twice(world):
    world.store.add(1)
    world.ledger.deduct(USER, 500, "payorder1")  # the first pay's charge; its idempotency record is gone
    assert world.service.pay(1).state is PAID
    assert len(world.ledger.deducts) == 1 and world.store.paid_by[1] == 501


def test_pay_settles_a_charge_found_even_past_the_close_time(world):
    world.store.add(1, close_at=NOW - 1)
    world.ledger.deduct(USER, 500, "payorder1")
    assert world.service.pay(1).state is PAID


def test_a_refused_pay_does_not_hold_up_the_close(world, monkeypatch):
    world.store.add(1)

    def refused(*args):
        raise errors.InsufficientBalance("no money")

    monkeypatch.setattr(world.ledger, "deduct", refused)
    with pytest.raises(errors.InsufficientBalance):
        world.service.pay(1)
    assert world.service.close(1).state is CLOSED


def test_an_unknown_pay_outcome_holds_up_the_close_for_the_horizon(world, monkeypatch):
    world.store.add(1)

    def unknown(*args):
        raise errors.ChargeOutcomeUnknown("no answer", entry_id="5")

    monkeypatch.setattr(world.ledger, "deduct", unknown)
    with pytest.raises(errors.ChargeOutcomeUnknown):
        world.service.pay(1)
    with pytest.raises(errors.ServiceUnavailable):
        world.service.close(1)


def test_a_charge_landing_after_a_newer_owner_closed_is_refunded_once(world, monkeypatch):
    world.store.add(1, amount=500)
    real = world.ledger.deduct

    def closed_meanwhile(user_id, amount, idem_key):
        world.store.rows[1] = dataclasses.replace(world.store.rows[1], state=CLOSED)
        return real(user_id, amount, idem_key)

    monkeypatch.setattr(world.ledger, "deduct", closed_meanwhile)
    with pytest.raises(errors.PaymentOrderClosed):
        world.service.pay(1)
    assert world.ledger.recharges == [(USER, 500, "payorderrefund1")] and world.store.refunded_by[1] == 901
    assert world.store.rows[1].state is CLOSED


def test_a_stale_owner_is_fenced_off(world):
    world.store.add(1)
    world.store.fences[1] = 99  # a newer owner took the row
    with pytest.raises(errors.FencedOut):
        world.service.close(1)
    with pytest.raises(errors.FencedOut):
        world.service.pay(1)
    assert world.store.rows[1].state is OPEN and world.ledger.deducts == []


def test_close_due_retries_a_failing_element_alone(world, monkeypatch):
    for i in (1, 2, 3):
        world.store.add(i)
    real = world.service.close

    def close(payment_order_id):
        if payment_order_id == 2:
            raise errors.ServiceUnavailable("lock store unreachable")
        return real(payment_order_id)

    monkeypatch.setattr(world.service, "close", close)
    world.service.close_due(["1", "2", "3"])
    assert [world.store.rows[i].state for i in (1, 2, 3)] == [CLOSED, OPEN, CLOSED]
    assert world.queue.due_at(CLOSE_QUEUE, "2") == NOW + po.RETRY_MS


def test_fire_reminders_handles_each_payment_order_alone(world):
    world.store.add(1)
    world.store.add(2, user_id=8)  # an account that no longer exists: nobody to remind
    world.store.add(3)
    world.store.add(4)
    world.inbox.failing = {"3"}
    world.service.fire_reminders(["1", "2", "3", "4"])
    assert [p[2] for p in world.inbox.posts] == ["1", "4"]
    assert world.store.reminded_at == {1: NOW, 2: NOW, 4: NOW}
    assert world.queue.due_at(REMINDER_QUEUE, "3") == NOW + po.RETRY_MS


# inbox --------------------------------------------------------------------------------------------------
class FakeInboxStore:
    def __init__(self):
        self.first: dict[tuple[int, str, str], str] = {}
        self.bodies: dict[int, list[str]] = {}
        self.posted = []

    def post(self, account, biz_type, outer_biz_id, message_id, created_ms, body, ttl_s, max_messages) -> PostReply:
        self.posted.append((account, message_id, created_ms, ttl_s, max_messages))
        first = self.first.setdefault((account, biz_type, outer_biz_id), message_id)
        if first != message_id:
            return PostReply(PostStatus.DUPLICATE, first)
        self.bodies.setdefault(account, []).append(body)
        return PostReply(PostStatus.NEW, message_id)

    def pull(self, account, after, limit) -> list[str]:
        return self.bodies.get(account, [])[:limit]


def test_inbox_post_answers_the_first_message_id_for_a_duplicate():
    store = FakeInboxStore()
    inbox = Inbox(store, Ids(), ttl_s=3600, max_messages=100, account_exists=lambda a: a == USER, now_ms=Clock())
    first = inbox.post(USER, "pay", "o-1", "Paid", "done", "app://x")
    again = inbox.post(USER, "pay", "o-1", "Paid twice", "again")
    other = inbox.post(USER, "pay", "o-2", "Paid", "done")
    assert (first.message_id, first.new) == ("1001", True)
    assert (again.message_id, again.new) == ("1001", False)  # the first message's id; nothing written
    assert other == ("1003", True)
    assert [m.content for m in inbox.pull(USER, None, 50)] == ["done", "done"]
    message = inbox.pull(USER, None, 1)[0]
    assert (message.message_id, message.biz_type, message.outer_biz_id, message.url, message.created_at) == (
        "1001",
        "pay",
        "o-1",
        "app://x",
        NOW,
    )
    assert store.posted[0] == (USER, "1001", NOW, 3600, 100)
    with pytest.raises(errors.AccountNotFound):
        inbox.post(USER + 1, "pay", "o-3", "t", "c")
    assert len(store.posted) == 3


def test_inbox_message_body_is_compact_json_in_field_order():
    store = FakeInboxStore()
    Inbox(store, Ids(), 60, 10, lambda a: True, now_ms=Clock()).post(USER, "b", "o", "t", "c")
    body = store.bodies[USER][0]
    assert body == json.dumps(
        {
            "message_id": "1001",
            "biz_type": "b",
            "outer_biz_id": "o",
            "title": "t",
            "content": "c",
            "url": None,
            "created_at": NOW,
        },
        separators=(",", ":"),
    )


# journeys -----------------------------------------------------------------------------------------------
class FakeJourneyStore:
    def __init__(self):
        self.starts: dict[str, dict[int, int]] = {}
        self.done_calls = []

    def start(self, biz, account, now_ms) -> int:
        return self.starts.setdefault(biz, {}).setdefault(account, now_ms)

    def finish(self, biz, account) -> bool:
        return self.starts.get(biz, {}).pop(account, None) is not None

    def started_before(self, biz, before_ms, limit):
        stale = sorted(
            (started, account) for account, started in self.starts.get(biz, {}).items() if started <= before_ms
        )
        return [(account, started) for started, account in stale][:limit]

    def done(self, biz, account, started) -> bool:
        self.done_calls.append((biz, account, started))
        if self.starts.get(biz, {}).get(account) == started:
            del self.starts[biz][account]
            return True
        return False


def test_journey_thresholds_parse_from_the_setting():
    assert parse_thresholds("password-recovery=1800, bind-card = 600,") == {"password-recovery": 1800, "bind-card": 600}
    assert parse_thresholds("") == {}
    with pytest.raises(ValueError):
        parse_thresholds("password-recovery=soon")


def test_journey_scan_posts_one_message_per_stale_start():
    store, inbox = FakeJourneyStore(), FakeInbox(accounts=(1, 2, 3, 5))
    journeys = Journeys(store, inbox, {"password-recovery": 1800, "bind-card": 600})
    minute = 60_000
    journeys.start("password-recovery", 1, NOW - 31 * minute)  # stale
    journeys.start("password-recovery", 2, NOW - 29 * minute)  # not yet
    journeys.start("password-recovery", 3, NOW - 30 * minute)  # exactly at the threshold: stale
    journeys.start("bind-card", 5, NOW - 11 * minute)
    store.starts["bind-card"][4] = NOW - 11 * minute  # account 4 was deleted since
    assert journeys.start("password-recovery", 1, NOW) == NOW - 31 * minute  # a repeat keeps the first start
    assert journeys.scan(NOW).reminded == 4
    title, content, url = TEXTS["password-recovery"]
    assert sorted(inbox.posts) == sorted(
        [
            (1, "JOURNEY_password-recovery", f"1:{NOW - 31 * minute}", title, content, url),
            (3, "JOURNEY_password-recovery", f"3:{NOW - 30 * minute}", title, content, url),
            (5, "JOURNEY_bind-card", f"5:{NOW - 11 * minute}", *DEFAULT_TEXT),
        ]
    )
    assert store.starts == {
        "password-recovery": {2: NOW - 29 * minute},
        "bind-card": {},
    }  # the gone account dropped too
    assert journeys.scan(NOW).reminded == 0


def test_journeys_refuse_unknown_biz_and_unknown_accounts():
    store = FakeJourneyStore()
    journeys = Journeys(store, FakeInbox(accounts=(1,)), {"password-recovery": 1800})
    with pytest.raises(errors.JourneyNotFound):
        journeys.start("bind-card", 1, NOW)
    with pytest.raises(errors.JourneyNotFound):
        journeys.finish("bind-card", 1)
    with pytest.raises(errors.AccountNotFound):
        journeys.start("password-recovery", 2, NOW)
    assert store.starts == {}
    journeys.start("password-recovery", 1, NOW)
    assert journeys.finish("password-recovery", 1) is True and journeys.finish("password-recovery", 1) is False


# delay queue ----------------------------------------------------------------------------------------------
class FakeDelayQueue:
    """Hands out what the test put in `due`, `batch`-limited, and records every call in order."""

    def __init__(self, due: dict[str, list[str]], next_due: dict[str, int], max_deliveries: int = 3):
        self.due, self.next_due, self.calls, self.max_deliveries = due, next_due, [], max_deliveries
        self.counts: dict[str, int] = {}
        self.retry_base_ms = 1000

    def drain(self, queue: str, now_ms: int, limit: int) -> Taken:
        taken, self.due[queue] = self.due[queue][:limit], self.due[queue][limit:]
        self.calls.append(("drain", queue, list(taken)))
        out = []
        for e in taken:
            self.counts[e] = self.counts.get(e, 0) + 1
            out.append(dq.Delivery(e, now_ms, dq.receipt(self.counts[e], e), self.counts[e]))
        return Taken(out, self.next_due.get(queue, NO_TIME), NO_TIME)

    def ack(self, queue: str, receipts: list[str]) -> list[bool]:
        self.calls.append(("ack", queue, [dq.parse_receipt(r)[1] for r in receipts]))
        return [True] * len(receipts)

    def retry(self, queue: str, receipts: list[str]) -> list[dq.RetryOutcome]:
        elements = [dq.parse_receipt(r)[1] for r in receipts]
        self.calls.append(("retry", queue, elements))
        return [
            dq.RetryOutcome.DEAD if self.counts[e] >= self.max_deliveries else dq.RetryOutcome.RETRY for e in elements
        ]


def test_drainer_hands_due_elements_to_their_handler_then_acknowledges_them():
    queue = FakeDelayQueue({"a": ["a1", "a2", "a3"], "b": []}, {"a": NOW + 500, "b": NOW + 100})
    handled = []
    drainer = Drainer(
        queue, {"a": lambda es: handled.append(("a", es, list(queue.calls))), "b": handled.append}, batch=2
    )
    assert drainer.drain_due(NOW) == NOW + 100  # the earliest next due time over every queue
    assert [(q, es) for q, es, _ in handled] == [("a", ["a1", "a2"]), ("a", ["a3"])]
    assert handled[0][2] == [("drain", "a", ["a1", "a2"])]  # handed over before its ack
    assert queue.calls == [
        ("drain", "a", ["a1", "a2"]),
        ("ack", "a", ["a1", "a2"]),
        ("drain", "a", ["a3"]),
        ("ack", "a", ["a3"]),
        ("drain", "b", []),
    ]
    assert drainer.handled == 3


def test_a_failing_handler_does_not_stop_the_drainer_and_only_the_failing_element_is_retried():
    """Issue 10 item 17: a handler exception ended the run (later queues starved)."""
    queue = FakeDelayQueue({"a": ["a1", "bad", "a3"], "b": ["b1"]}, {})
    got = []

    def handler(elements):
        if "bad" in elements:
            raise RuntimeError("handler down")
        got.extend(elements)

    drainer = Drainer(queue, {"a": handler, "b": got.extend})
    drainer.drain_due(NOW)
    assert queue.calls == [
        ("drain", "a", ["a1", "bad", "a3"]),
        ("ack", "a", ["a1"]),
        ("retry", "a", ["bad"]),
        ("ack", "a", ["a3"]),
        ("drain", "b", ["b1"]),
        ("ack", "b", ["b1"]),
    ]
    assert got == ["a1", "a3", "b1"] and drainer.handled == 3  # one at a time after the batch failed
    assert (drainer.runs["a"].failures, drainer.runs["a"].dead_lettered) == (1, 0)


def test_a_delivery_that_failed_max_deliveries_times_is_dead_lettered_and_counted():
    queue = FakeDelayQueue({"a": ["bad"]}, {}, max_deliveries=2)
    queue.counts["bad"] = 1  # delivered once before

    def fail(elements):
        raise RuntimeError("poison")

    drainer = Drainer(queue, {"a": fail})
    assert drainer.drain_due(NOW) == NOW + 1000  # wakes for the retry (here: nothing else is due)
    run = drainer.runs["a"]
    assert (run.redeliveries, run.failures, run.dead_lettered, run.handled) == (1, 1, 1, 0)
    assert queue.calls == [("drain", "a", ["bad"]), ("retry", "a", ["bad"])]


def test_receipts_are_sequence_and_element_and_anything_else_is_refused():
    assert dq.receipt(1795467897855001, "a:b") == "1795467897855001:a:b"
    assert dq.parse_receipt("1795467897855001:a:b") == ("1795467897855001", "a:b")
    for bad in ("", "x:a", "12", "12:", ":a", "١٢:a"):
        with pytest.raises(ValueError):
            dq.parse_receipt(bad)


def test_canonical_encoding_makes_equal_elements_equal_members():
    assert canonical("order-1") == "order-1" and canonical('{"b":1}') == '{"b":1}'  # strings as they are
    assert canonical({"b": 1, "a": [1, {"d": 2, "c": None}]}) == '{"a":[1,{"c":null,"d":2}],"b":1}'
    assert canonical({"b": 1, "a": 2}) == canonical({"a": 2, "b": 1})
    assert canonical(42) == "42" and canonical([2, 1]) == "[2,1]"


def test_taken_next_wake_is_the_earlier_of_due_and_deadline():
    assert Taken([], NOW + 5, NOW + 3).next_wake() == NOW + 3
    assert Taken([], NOW + 2, NOW + 3).next_wake() == NOW + 2
    assert Taken([], NO_TIME, NOW + 3).next_wake() == NOW + 3
    assert Taken([], NOW + 5, NO_TIME).next_wake() == NOW + 5
    assert Taken([], NO_TIME, NO_TIME).next_wake() == NO_TIME


class ScriptedLua:
    """Answers Lua.run with a canned raw reply and records the call."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def run(self, name, keys, args, client=None):
        self.calls.append((name, keys, args))
        return self.reply


def test_delay_script_replies_are_parsed():
    lua = ScriptedLua([[b"e1", b"1800000000000", 7, 1, b"e2", b"1.8e+12", 8, 3], b"1800000000500", b"-1", 2])
    taken = dq.delay_take(lua, "q", NOW, 10, 30_000, 5)
    assert taken == Taken([dq.Delivery("e1", NOW, "7:e1", 1), dq.Delivery("e2", NOW, "8:e2", 3)], NOW + 500, NO_TIME, 2)
    assert taken.elements == [("e1", NOW), ("e2", NOW)]
    assert lua.calls == [
        (
            "delay_take",
            ["dq:due:{q}", "dq:taken:{q}", "dq:receipt:{q}", "dq:deliveries:{q}", "dq:seq:{q}", "dq:dead:{q}"],
            [NOW, 10, 30_000, 5],
        )
    ]
    assert dq.delay_ack(ScriptedLua([1, 0]), "q", ["7:e1", "6:e2"]) == [True, False]
    assert dq.delay_retry(ScriptedLua([0, 1, 2]), "q", ["1:a", "2:b", "3:c"], NOW, 1000, 60_000, 5) == [
        dq.RetryOutcome.STALE,
        dq.RetryOutcome.RETRY,
        dq.RetryOutcome.DEAD,
    ]
    assert dq.delay_offer(ScriptedLua([0, b"1800000000000"]), "q", "e", NOW) == dq.Offered(False, NOW)
    assert dq.delay_remove(ScriptedLua(1), "q", "e") is True and dq.delay_remove(ScriptedLua(0), "q", "e") is False


def test_lock_acquire_reply_is_parsed():
    assert AcquireReply.parse([b"acquired", 7, 1]) == AcquireReply(AcquireStatus.ACQUIRED, fence=7, count=1)
    assert AcquireReply.parse([b"held", 1234]) == AcquireReply(AcquireStatus.HELD, pttl=1234)


def test_inbox_business_keys_are_unambiguous():
    from hotledger import keys

    assert keys.inbox_biz(7, "a:b", "c") != keys.inbox_biz(7, "a", "b:c")
    assert keys.inbox_biz(7, "a", "b") == keys.inbox_biz(7, "a", "b")
    assert keys.inbox_biz(7, "ab", "") != keys.inbox_biz(7, "a", "b") != keys.inbox_biz(7, "", "ab")
