"""Vouchers' decisions with in-memory stores: the order path (refusals, reload, unknown outcomes, publish or
undo), the writer's persister (duplicates, clashes, stock) and the reconciler (compensate, rebuild, correct,
retire). No server is reached."""

from __future__ import annotations

import contextlib
import itertools
import json

import pytest

from fakes import FakeOutbox
from helpers import run_event_keys, verified_fields
from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.publisher import NotAcknowledged
from hotledger.dal.redis_store import RedisOutcomeUnknown, RedisUnavailable
from hotledger.outbox.durable import Durability
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.outbox.log_hold import LogHold
from hotledger.outbox.writer import PersistReport
from hotledger.vouchers.persist import VoucherPersister
from hotledger.vouchers.reconcile import VoucherReconciler
from hotledger.vouchers.replies import OrderReply, OrderStatus, ReconcileReply, ReconcileStatus, SettleReply
from hotledger.vouchers.rows import OrderRow, StockRow, VoucherRow, VoucherSnapshot
from hotledger.vouchers.service import VoucherOrder, Vouchers

NOW = 1_700_000_000_000
NO_LOG_HOLD = LogHold(
    None, dict, "unused", streamed=True
)  # rebuilds hold by time only; the log hold is in tests/integration
CFG = Settings(event_transport="kafka", rebuild_hold_s=10, finished_keys_ttl_s=3600)
HOUR = 3_600_000


# ----------------------------------------------------------------------------------------------------- fakes
class FakeDb:
    def __init__(self):
        self.vouchers: dict[int, dict] = {}
        self.orders: dict[int, OrderRow] = {}
        self.ids = itertools.count(1)
        self.rolled: set[int] = set()  # t_rolled_back
        self.record_error: Exception | None = None

    def add(self, stock=10, initial=None, begin_at=NOW - HOUR, end_at=NOW + HOUR, limit=1, version=0) -> int:
        voucher_id = next(self.ids)
        self.vouchers[voucher_id] = dict(
            title="10 off",
            initial=initial or stock,
            stock=stock,
            limit=limit,
            begin=begin_at,
            end=end_at,
            version=version,
        )
        return voucher_id

    @staticmethod
    def transaction():
        return contextlib.nullcontext("cursor")

    def create(self, cur, title, stock, per_user_limit, begin_at, end_at, stock_shards=1) -> int:
        return self.add(stock=stock, begin_at=begin_at, end_at=end_at, limit=per_user_limit)

    def find(self, voucher_id):
        v = self.vouchers.get(voucher_id)
        return v and VoucherRow(voucher_id, v["title"], v["initial"], v["stock"], v["limit"], v["begin"], v["end"])

    def find_order(self, voucher_id, order_id):
        row = self.orders.get(order_id)
        return row if row is not None and row.voucher_id == voucher_id else None

    def ending_after(self, moment_ms, after_id=0, limit=2**62):
        return [
            (voucher_id, v["end"], 1)
            for voucher_id, v in sorted(self.vouchers.items())
            if v["end"] > moment_ms and voucher_id > after_id
        ][:limit]

    def lock_snapshot(self, cur, voucher_id):
        v = self.vouchers.get(voucher_id)
        if v is None:
            return None
        buyers: dict[int, int] = {}
        for row in self.orders.values():
            if row.voucher_id == voucher_id:
                buyers[row.user_id] = buyers.get(row.user_id, 0) + 1
        return VoucherSnapshot(v["stock"], v["begin"], v["end"], v["limit"], v["version"], buyers)

    def bucket_stocks(self, cur, voucher_id):
        return [self.vouchers[voucher_id]["stock"]]

    def lock_stocks(self, cur, voucher_ids):
        return {
            i: StockRow(self.vouchers[i]["stock"], self.vouchers[i]["version"])
            for i in voucher_ids
            if i in self.vouchers
        }

    def orders_by_id(self, cur, order_ids):
        return {i: self.orders[i] for i in order_ids if i in self.orders}

    def record_rollback(self, voucher_id, order_id):
        if self.record_error:
            raise self.record_error
        if order_id in self.orders:
            return True
        self.rolled.add(order_id)
        return False

    def rolled_back(self, cur, order_ids):
        return {i for i in order_ids if i in self.rolled}

    def slot_holders(self, cur, slots):
        return {row.slot: row.order_id for row in self.orders.values() if row.slot in slots}

    def insert_orders(self, cur, orders):
        for e in orders:
            assert e.id not in self.orders, "the DB refuses a second row with one id"
            self.orders[e.id] = OrderRow(e.id, e.voucher_id, e.user_id, e.seq)

    def take_stock(self, cur, sold):
        for (voucher_id, _bucket), n in sold.items():
            self.vouchers[voucher_id]["stock"] -= n
            self.vouchers[voucher_id]["version"] += 1


class FakeRedis:
    """The scripts' replies are given by the test; reads answer from `held` (voucher -> stock) and `pending`."""

    def __init__(self, *order_replies):
        self.order_replies = list(order_replies)
        self.orders, self.rollbacks, self.loads, self.settles, self.reconciles, self.expired = [], [], [], [], [], []
        self.rollback_answer: Exception | None = None
        self.held: dict[int, int] = {}
        self.pending: dict[int, dict[int, VoucherOrderEvent]] = {}

    def order(self, voucher_id, user_id, order_id, now_ms, home=0, shards=1):
        self.orders.append((voucher_id, user_id, order_id, now_ms))
        reply = self.order_replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def rollback(self, voucher_id, order_id, user_id, bucket=0, home=0):
        self.rollbacks.append((voucher_id, order_id, user_id))
        if self.rollback_answer is not None:
            raise self.rollback_answer

    def load(self, voucher_id, snapshot, epoch, hold_until, hold_log="", bucket=0):
        self.loads.append((voucher_id, snapshot, epoch, hold_until))
        if voucher_id in self.held:
            return False
        self.held[voucher_id] = snapshot.stock
        return True

    def settle(self, versions, orders):
        self.settles.append((dict(versions), sorted(e.id for e in orders)))
        return {e.voucher_id: SettleReply(0, 0) for e in orders}

    def reconcile(self, voucher_id, db_stock, persisted, bucket=0):
        self.reconciles.append((voucher_id, db_stock, sorted(persisted)))
        if voucher_id not in self.held:
            return ReconcileReply(ReconcileStatus.MISSING)
        for order_id in persisted:
            self.pending.get(voucher_id, {}).pop(order_id, None)
        before, after = self.held[voucher_id], db_stock - self.pending_count(voucher_id)
        self.held[voucher_id] = after
        return ReconcileReply(ReconcileStatus.SAME if before == after else ReconcileStatus.CORRECTED, before, after)

    def stock_left(self, voucher_id, bucket=0):
        return self.held.get(voucher_id)

    def pending_count(self, voucher_id, bucket=0):
        return len(self.pending.get(voucher_id, {}))

    def pending_ids(self, voucher_id, bucket=0):
        return list(self.pending.get(voucher_id, {}))

    def pending_order(self, voucher_id, order_id, bucket=0):
        return self.pending.get(voucher_id, {}).get(order_id)

    def pending_orders(self, voucher_id, bucket=0):
        return list(self.pending.get(voucher_id, {}).values())

    def expire(self, voucher_id, ttl_s, bucket=0):
        self.expired.append((voucher_id, ttl_s))


class Broker:
    def __init__(self, fails=False):
        self.fails, self.sent = fails, []

    def __call__(self, key, value):
        if self.fails:
            raise NotAcknowledged("no acknowledgement in time")
        self.sent.append((key, json.loads(value)))


def service(db=None, redis=None, broker=None):
    ids = itertools.count(1000)
    db, redis, broker = db or FakeDb(), redis or FakeRedis(), broker or Broker()
    return (
        Vouchers(
            CFG,
            db,
            redis,
            Durability(CFG, broker, lambda: next(ids), run_event_keys()),
            lambda: next(ids),
            NO_LOG_HOLD,
            clock=lambda: NOW,
        ),
        db,
        redis,
        broker,
    )


def ok(seq=1, epoch="e1"):
    return OrderReply(OrderStatus.OK, seq=seq, epoch=epoch)


def event(order_id, voucher_id, user_id, seq=1, ts=NOW, epoch="e1"):
    return VoucherOrderEvent(
        type="voucher_order", id=order_id, voucher_id=voucher_id, user_id=user_id, seq=seq, ts=ts, epoch=epoch
    )


def dead_reasons(outbox):
    return sorted((r.offset, r.error) for r in outbox.dead)


# ---------------------------------------------------------------------------------------------- the order path
def test_an_order_taken_in_redis_is_published_before_it_is_answered():
    vouchers, _, redis, broker = service(redis=FakeRedis(ok(seq=2, epoch="load7")))
    order = vouchers.order(5, 42)
    assert (order.order_id, order.voucher_id, order.user_id, order.seq, order.status) == (1000, 5, 42, 2, "PENDING")
    assert redis.orders == [(5, 42, 1000, NOW)]  # one bucket: the home is bucket 0
    assert [(key, verified_fields(event)) for key, event in broker.sent] == [
        (
            "v5",
            {
                "type": "voucher_order",
                "id": 1000,
                "voucher_id": 5,
                "user_id": 42,
                "seq": 2,
                "ts": NOW,
                "epoch": "load7",
                "bucket": 0,
                "home": 0,
            },
        )
    ]
    assert redis.rollbacks == []


@pytest.mark.parametrize(
    "reply, error, details",
    [
        (OrderReply(OrderStatus.NOT_STARTED, at=str(NOW + HOUR)), errors.NotStarted, {"begin_at": str(NOW + HOUR)}),
        (OrderReply(OrderStatus.ENDED, at=str(NOW - 1)), errors.Ended, {"end_at": str(NOW - 1)}),
        (OrderReply(OrderStatus.SOLD_OUT), errors.SoldOut, {}),
        (OrderReply(OrderStatus.ALREADY), errors.AlreadyOrdered, {}),
        (OrderReply(OrderStatus.RECOVERING, at=str(NOW + 5000)), errors.Recovering, {"retry_at": str(NOW + 5000)}),
    ],
)
def test_every_refusal_is_its_domain_error_and_publishes_nothing(reply, error, details):
    vouchers, _, redis, broker = service(redis=FakeRedis(reply))
    with pytest.raises(error) as refused:
        vouchers.order(5, 42)
    assert refused.value.details == details
    assert (broker.sent, redis.rollbacks, redis.loads) == ([], [], [])


def test_a_voucher_redis_lost_is_rebuilt_with_a_hold_and_the_order_retried_under_its_reserved_id():
    db = FakeDb()
    voucher_id = db.add(stock=7, limit=2)
    db.orders[1] = OrderRow(1, voucher_id, 42, 1)
    vouchers, _, redis, broker = service(db, FakeRedis(OrderReply(OrderStatus.MISSING), ok(seq=2)))
    reserved = []
    order = vouchers.order(voucher_id, 42, reserve=reserved.append)
    ((loaded, snapshot, epoch, hold_until),) = redis.loads
    assert (loaded, snapshot.stock, snapshot.per_user_limit, snapshot.buyers) == (voucher_id, 7, 2, {42: 1})
    assert hold_until == NOW + CFG.rebuild_hold_s * 1000  # orders in flight before the loss land first
    # a refused 'missing' took nothing: the retry after the load runs under the id reserved before any effect
    assert [o[2] for o in redis.orders] == [1000, 1000] and reserved == [1000]
    assert epoch != "1000" and order.order_id == 1000 and len(broker.sent) == 1


def test_an_order_resumed_under_a_reserved_id_answers_it_from_the_db_or_takes_a_new_one_if_it_was_rolled_back():
    db = FakeDb()
    voucher_id = db.add(stock=7, limit=2)
    db.orders[77] = OrderRow(77, voucher_id, 42, 2)
    vouchers, _, redis, broker = service(db, FakeRedis(ok(seq=2)))
    assert vouchers.order(voucher_id, 42, order_id=77) == VoucherOrder(77, voucher_id, 42, 2, "PERSISTED")
    assert (redis.orders, broker.sent) == ([], [])  # in the DB: nothing taken again
    db.rolled.add(78)
    assert vouchers.order(voucher_id, 42, order_id=78).order_id == 1000  # taken back for good: a new order
    assert [o[2] for o in redis.orders] == [1000]


def test_ordering_a_voucher_the_db_does_not_know_is_voucher_not_found():
    vouchers, _, redis, broker = service(redis=FakeRedis(OrderReply(OrderStatus.MISSING)))
    with pytest.raises(errors.VoucherNotFound):
        vouchers.order(99, 42)
    assert (redis.loads, broker.sent) == ([], [])


def test_a_lost_script_answer_is_outcome_unknown_naming_the_order():
    vouchers, _, redis, broker = service(redis=FakeRedis(RedisOutcomeUnknown("timeout")))
    with pytest.raises(errors.ChargeOutcomeUnknown) as unknown:
        vouchers.order(5, 42)
    assert unknown.value.code == "OUTCOME_UNKNOWN" and unknown.value.details == {"entry_id": "1000"}
    assert (broker.sent, redis.rollbacks) == ([], [])


def test_a_failed_publish_is_rolled_back_and_answered_publish_failed():
    vouchers, db, redis, _ = service(redis=FakeRedis(ok()), broker=Broker(fails=True))
    with pytest.raises(errors.PublishFailed) as failed:
        vouchers.order(5, 42)
    assert failed.value.code == "PUBLISH_FAILED"
    assert db.rolled == {1000} and redis.rollbacks == [(5, 1000, 42)]  # recorded in the DB, then given back


def test_a_failed_publish_the_writer_persisted_first_stands():
    """The DB decides under the voucher row lock: persisted first, the order stands whatever Redis says."""
    db = FakeDb()
    db.orders[1000] = OrderRow(1000, 5, 42, 1)
    vouchers, _, redis, _ = service(db, FakeRedis(ok(seq=1)), Broker(fails=True))
    assert vouchers.order(5, 42).order_id == 1000
    assert redis.rollbacks == [] and db.rolled == set()


def test_a_failed_publish_whose_rollback_the_db_cannot_record_is_outcome_unknown():
    db = FakeDb()
    db.record_error = DatabaseUnavailable("gone")
    vouchers, _, redis, _ = service(db, FakeRedis(ok()), Broker(fails=True))
    with pytest.raises(errors.ChargeOutcomeUnknown):
        vouchers.order(5, 42)
    assert redis.rollbacks == []


def test_a_failed_publish_whose_rollback_cannot_reach_redis_is_outcome_unknown():
    redis = FakeRedis(ok())
    redis.rollback_answer = RedisUnavailable("connection refused")
    vouchers, *_ = service(redis=redis, broker=Broker(fails=True))
    with pytest.raises(errors.ChargeOutcomeUnknown) as unknown:
        vouchers.order(5, 42)
    assert unknown.value.details == {"entry_id": "1000"}


def test_loading_an_ended_sale_retires_its_keys_and_a_live_one_stays():
    db = FakeDb()
    ended, live = db.add(begin_at=NOW - 2 * HOUR, end_at=NOW), db.add()
    vouchers, _, redis, _ = service(db)
    vouchers.load(ended, hold_until=0)
    vouchers.load(live, hold_until=0)
    assert redis.expired == [(ended, CFG.finished_keys_ttl_s)]
    assert [(v, hold) for v, _, _, hold in redis.loads] == [(ended, 0), (live, 0)]


def test_a_new_voucher_is_loaded_without_hold_and_read_back_with_sold_and_pending():
    vouchers, db, redis, _ = service()
    voucher_id = vouchers.create_voucher("10 off", 5, NOW - 1000, NOW + HOUR, 1)
    assert [(v, s.stock, hold) for v, s, _, hold in redis.loads] == [(voucher_id, 5, 0)]
    db.vouchers[voucher_id]["stock"] = 3  # two sold in the DB
    redis.held[voucher_id] = 2
    redis.pending[voucher_id] = {77: event(77, voucher_id, 9)}
    view = vouchers.get_voucher(voucher_id)
    assert (view.initial_stock, view.stock_left, view.sold, view.pending) == (5, 2, 2, 1)


def test_reading_a_voucher_redis_lost_rebuilds_it_from_the_db():
    db = FakeDb()
    voucher_id = db.add(stock=4, initial=6)
    vouchers, _, redis, _ = service(db)
    assert vouchers.get_voucher(voucher_id).stock_left == 4
    assert [hold for *_, hold in redis.loads] == [NOW + CFG.rebuild_hold_s * 1000]
    with pytest.raises(errors.VoucherNotFound):
        vouchers.get_voucher(99)


def test_a_voucher_redis_loses_again_while_it_is_read_is_redis_unavailable_not_a_crash():
    class LosingRedis(FakeRedis):
        def stock_left(self, voucher_id, bucket=0):
            return None  # gone again right after each rebuild (a flush or failover meanwhile)

    db = FakeDb()
    voucher_id = db.add(stock=4)
    vouchers, *_ = service(db, LosingRedis())
    with pytest.raises(RedisUnavailable):
        vouchers.get_voucher(voucher_id)


def test_an_order_is_pending_in_redis_then_persisted_in_the_db_or_not_found():
    db = FakeDb()
    voucher_id = db.add()
    vouchers, _, redis, _ = service(db)
    redis.pending[voucher_id] = {11: event(11, voucher_id, 42, seq=1)}
    db.orders[12] = OrderRow(12, voucher_id, 43, 2)
    assert vouchers.get_order(voucher_id, 11).status == "PENDING"
    persisted = vouchers.get_order(voucher_id, 12)
    assert (persisted.user_id, persisted.seq, persisted.status) == (43, 2, "PERSISTED")
    with pytest.raises(errors.OrderNotFound):
        vouchers.get_order(voucher_id + 1, 12)  # another voucher's order


# -------------------------------------------------------------------------------------------------- persister
def persister(db, outbox=None):
    redis = FakeRedis()
    return VoucherPersister(db, redis, outbox or FakeOutbox()), redis


def test_new_orders_are_inserted_the_stock_moved_and_settled_with_the_new_version():
    db = FakeDb()
    a, b = db.add(stock=5, version=3), db.add(stock=5, version=8)
    writer, redis = persister(db)
    report = writer.persist([event(1, a, 10), event(2, a, 11), event(3, b, 10)])
    assert (report.applied, report.duplicates, report.dead_lettered) == (3, 0, 0)
    assert (db.vouchers[a]["stock"], db.vouchers[b]["stock"]) == (3, 4)
    assert redis.settles[0] == ({a: 4, b: 9}, [1, 2, 3])


def test_a_redelivered_order_changes_nothing_and_is_settled_without_a_version():
    db = FakeDb()
    voucher_id = db.add(stock=5, version=1)
    writer, redis = persister(db)
    writer.persist([event(1, voucher_id, 10)])
    report = writer.persist([event(1, voucher_id, 10), event(1, voucher_id, 10)])
    assert (report.applied, report.duplicates, report.dead_lettered) == (
        0,
        2,
        0,
    )  # one repeat in the batch, one in the DB
    assert db.vouchers[voucher_id]["stock"] == 4
    assert redis.settles[-2:] == [({}, []), ({}, [1])]  # version 0: never counted late a second time


def test_an_id_clash_and_a_taken_slot_are_dead_lettered_never_inserted():
    db = FakeDb()
    voucher_id = db.add(stock=5, limit=3)
    db.orders[1] = OrderRow(1, voucher_id, 10, 1)
    outbox = FakeOutbox()
    writer, _ = persister(db, outbox)
    report = writer.persist(
        [
            event(1, voucher_id, 99),  # id 1 belongs to another order
            event(2, voucher_id, 10, seq=1),  # user 10's first slot is order 1's
            event(4, voucher_id, 11, seq=1, ts=NOW + 1),  # same slot as order 3, which came first
            event(3, voucher_id, 11, seq=1, ts=NOW),
        ]
    )
    assert (report.applied, report.dead_lettered) == (1, 3)
    assert dead_reasons(outbox) == [
        (1, "order id already used by another order"),
        (2, "the buyer's order slot is taken by another order"),
        (4, "the buyer's order slot is taken by another order"),
    ]
    assert sorted(db.orders) == [1, 3] and db.orders[1].user_id == 10


def test_the_db_never_sells_below_zero():
    db = FakeDb()
    voucher_id = db.add(stock=1)
    outbox = FakeOutbox()
    writer, redis = persister(db, outbox)
    report = writer.persist([event(2, voucher_id, 11, ts=NOW + 1), event(1, voucher_id, 10, ts=NOW)])
    assert (report.applied, report.dead_lettered) == (1, 1)
    assert db.vouchers[voucher_id]["stock"] == 0 and list(db.orders) == [1]  # the earlier order wins
    assert dead_reasons(outbox) == [(2, "sold out in the DB")]
    assert redis.settles[0] == ({voucher_id: 1}, [1])


def test_an_order_of_an_unknown_voucher_is_dead_lettered():
    db = FakeDb()
    voucher_id = db.add()
    outbox = FakeOutbox()
    writer, _ = persister(db, outbox)
    report = writer.persist([event(1, 99, 10), event(2, voucher_id, 10)])
    assert (report.applied, report.dead_lettered) == (1, 1)
    assert dead_reasons(outbox) == [(1, "voucher does not exist")] and outbox.dead[0].key == b"v99"
    assert list(db.orders) == [2]


def test_an_order_the_api_rolled_back_first_is_never_persisted():
    db = FakeDb()
    voucher_id = db.add(stock=5)
    writer, _ = persister(db, FakeOutbox(rolled_back={keys.voucher_fate(voucher_id, 1)}))
    report = writer.persist([event(1, voucher_id, 10), event(2, voucher_id, 11)])
    assert (report.applied, report.rolled_back) == (1, 1)
    assert list(db.orders) == [2] and db.vouchers[voucher_id]["stock"] == 4


def test_an_order_the_db_rolled_back_is_never_persisted_whatever_redis_says_and_is_given_back():
    """Redis lost the tombstone (or it expired before a replay): the claim succeeds, the DB's record decides."""
    db = FakeDb()
    voucher_id = db.add(stock=5)
    db.rolled.add(1)
    writer, redis = persister(db, FakeOutbox())
    report = writer.persist([event(1, voucher_id, 10), event(2, voucher_id, 11)])
    assert (report.applied, report.rolled_back) == (1, 1)
    assert list(db.orders) == [2] and db.vouchers[voucher_id]["stock"] == 4
    assert redis.rollbacks == [(voucher_id, 1, 10)]


# --------------------------------------------------------------------------------------------------- reconciler
class RecordingPersister:
    def __init__(self):
        self.batches = []

    def persist(self, events):
        self.batches.append(sorted(e.id for e in events))
        return PersistReport(applied=len(events))


def reconciler(db):
    vouchers, _, redis, _ = service(db)
    persisted = RecordingPersister()
    return VoucherReconciler(vouchers, persisted, db, redis), redis, persisted


def test_orders_pending_longer_than_the_age_are_persisted_and_younger_ones_wait():
    db = FakeDb()
    voucher_id = db.add(stock=10)
    run, redis, persisted = reconciler(db)
    redis.held[voucher_id] = 8
    redis.pending[voucher_id] = {
        1: event(1, voucher_id, 10, ts=NOW - 301_000),
        2: event(2, voucher_id, 11, ts=NOW - 1000),
    }
    report = run.run(NOW, age_s=300)
    assert persisted.batches == [[1]]
    assert (report.vouchers, report.pending, report.compensated, report.corrected, report.rebuilt) == (1, 2, 1, 0, 0)


def test_a_voucher_redis_lost_is_rebuilt_with_a_hold():
    db = FakeDb()
    voucher_id = db.add(stock=6)
    run, redis, _ = reconciler(db)
    report = run.run(NOW, age_s=300)
    assert report.rebuilt == 1
    assert [(v, hold) for v, _, _, hold in redis.loads] == [(voucher_id, NOW + CFG.rebuild_hold_s * 1000)]


def test_drifted_stock_is_corrected_from_the_db_minus_what_is_still_pending():
    db = FakeDb()
    voucher_id = db.add(stock=9, initial=10)
    db.orders[1] = OrderRow(1, voucher_id, 10, 1)  # persisted, but its settle was lost: still pending in Redis
    run, redis, _ = reconciler(db)
    redis.held[voucher_id] = 3
    redis.pending[voucher_id] = {1: event(1, voucher_id, 10), 2: event(2, voucher_id, 11)}
    report = run.run(NOW, age_s=300)
    assert redis.reconciles == [(voucher_id, 9, [1])]
    assert report.corrected == 1 and redis.held[voucher_id] == 8
    assert run.run(NOW, age_s=300).corrected == 0


def test_an_ended_sale_is_retired_once_nothing_is_pending():
    db = FakeDb()
    empty = db.add(begin_at=NOW - 2 * HOUR, end_at=NOW - 1000)
    busy = db.add(begin_at=NOW - 2 * HOUR, end_at=NOW - 1000)
    live = db.add()
    long_gone = db.add(begin_at=NOW - 3 * HOUR, end_at=NOW - CFG.finished_keys_ttl_s * 1000)
    run, redis, _ = reconciler(db)
    redis.held.update({empty: 0, busy: 0, live: 5})
    redis.pending[busy] = {1: event(1, busy, 10, ts=NOW - 2000)}
    report = run.run(NOW, age_s=300)
    assert redis.expired == [(empty, CFG.finished_keys_ttl_s)]
    assert report.vouchers == 3 and long_gone not in [r[0] for r in redis.reconciles]
