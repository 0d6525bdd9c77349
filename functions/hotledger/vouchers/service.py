"""Vouchers (flash sales).

A voucher lives in the DB and is loaded into Redis, where its stock is sold: an order is one script (time
window, stock, per-user limit, decrement, buyer record, pending order), made durable by the configured
transport before the answer (Durability.apply). The writer (persist.py) inserts the orders and moves the DB
stock in one transaction per batch; the reconciler (reconcile.py) keeps
Redis stock + orders pending in Redis + sold in the DB = initial stock.

Stock buckets (issue 12: one slot is one Redis shard's ceiling): a voucher created with stock_shards = N sells its
stock from N buckets, each its own slot, the stock split as evenly as possible. A buyer's home bucket
(home_bucket: a hash of the user id) holds the buyer's record, orders taken, and sells to them first: one script.
When the home is empty, that script reserves the buyer's next slot at home instead (an 'away' record) and names
the other buckets not seen empty within the last second; the unit is taken from the first that has one
(voucher_take, one script in that bucket), or, when none has, the reservation is given back and those buckets
are marked empty at home for a second, so a sold-out sale costs one script call per request, not N.

Invariants:
- Redis never sells below zero, in any bucket; the DB never sells below zero either (an order beyond the voucher's
  DB stock, the judge, is dead-lettered, not inserted);
- a buyer holds at most per_user_limit orders, each in its own slot (seq 1, 2, ...): the count lives in the buyer's
  home bucket only, and every slot is taken there (by a sale or an away reservation) before any unit is taken;
- per bucket: Redis stock + orders pending in the bucket = the bucket's DB stock (t_voucher_bucket), and every away
  reservation at home ends exactly once: the writer's settle drops it (the order stands), or it is given back
  (no unit taken, or the unit given back), or the reconciler resolves it after RECONCILE_AGE_S (a process died);
- a voucher Redis does not hold is loaded from the DB before any order runs on it. After a loss (rebuild),
  sales wait (RECOVERING) until the writer applied every order the log held then (outbox/log_hold.py; at least
  REBUILD_HOLD_S), so no unit acknowledged before the loss is sold again; the writer counts those orders into
  the rebuilt stock when they arrive;
- an ended sale's keys leave Redis FINISHED_KEYS_TTL_S after it ends and nothing is pending (a late request
  reloads them and is refused ENDED).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.outbox.durable import Durability, Outbound, Step
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.outbox.log_hold import LogHold
from hotledger.vouchers.replies import OrderReply, OrderStatus
from hotledger.vouchers.rows import VoucherSnapshot, home_bucket
from hotledger.vouchers.store import VoucherDb, VoucherRedis

if TYPE_CHECKING:
    from hotledger.vouchers.store import Cursor

SEEN_EMPTY_MS = 1000  # how long a home's buyers skip a bucket found empty (a unit given back there waits this long)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Voucher:
    voucher_id: int
    title: str
    initial_stock: int
    stock_left: int
    sold: int
    pending: int
    per_user_limit: int
    begin_at: int
    end_at: int
    bucket_stock_left: tuple[int, ...] = ()  # per stock bucket, in Redis


@dataclass(frozen=True)
class VoucherOrder:
    order_id: int
    voucher_id: int
    user_id: int
    seq: int
    status: str = "PENDING"


def _order_unknown(voucher_id: int, order_id: int, why: str) -> errors.DomainError:
    return errors.ChargeOutcomeUnknown(
        f"{why}: order {order_id} may or may not be taken. Check GET /vouchers/{voucher_id}/orders/{order_id} before "
        "trying again",
        entry_id=str(order_id),
    )


_REFUSALS = {
    OrderStatus.RECOVERING: lambda at: errors.Recovering(
        "the sale is being restored after a cache failure; retry in a few seconds", retry_at=at
    ),
    OrderStatus.HELD: lambda at: errors.Recovering(
        "the sale is being restored after a cache failure: orders taken before "
        "it are still on their way to the DB; retry in a few seconds",
        retry_at=at,
    ),
    OrderStatus.NOT_STARTED: lambda at: errors.NotStarted("the sale has not started yet", begin_at=at),
    OrderStatus.ENDED: lambda at: errors.Ended("the sale has ended", end_at=at),
    OrderStatus.SOLD_OUT: lambda at: errors.SoldOut("the voucher is sold out"),
    OrderStatus.ALREADY: lambda at: errors.AlreadyOrdered(
        "this user already holds the most orders of this voucher allowed per user"
    ),
}


def _refusal(reply: OrderReply) -> errors.DomainError | None:
    refuse = _REFUSALS.get(reply.status)
    return refuse(reply.at) if refuse else None


def _not_found(voucher_id: int) -> errors.DomainError:
    return errors.VoucherNotFound(f"voucher {voucher_id} does not exist")


class _Persisted(Exception):
    """A resumed order found in the DB once a rebuild's hold passed: it is the answer, nothing is taken."""

    def __init__(self, order: VoucherOrder):
        super().__init__(order.order_id)
        self.order = order


class Vouchers:
    def __init__(
        self,
        cfg: Settings,
        db: VoucherDb,
        redis: VoucherRedis,
        durability: Durability,
        next_id: Callable[[], int],
        hold: LogHold,
        clock: Callable[[], int] = wall_clock_ms,
    ):
        self.db, self.redis, self.durability, self.next_id, self.clock = db, redis, durability, next_id, clock
        self.hold = hold
        self.rebuild_hold_ms, self.finished_keys_ttl_s = cfg.rebuild_hold_ms, cfg.finished_keys_ttl_s
        self._shards: dict[int, int] = {}  # voucher id -> stock buckets: fixed at creation, read once per process

    def create_voucher(
        self, title: str, stock: int, begin_at: int, end_at: int, per_user_limit: int, stock_shards: int = 1
    ) -> int:
        # inserted and loaded into Redis in one transaction: nobody (the reconciler) sees the row before Redis holds
        # the voucher, so a new voucher is never taken for one Redis lost and rebuilt with a hold
        with self.db.transaction() as cur:
            voucher_id = self.db.create(cur, title, stock, per_user_limit, begin_at, end_at, stock_shards)
            snapshot = self._load(cur, voucher_id, hold_until=0)
        self._retire_if_ended(voucher_id, snapshot)
        return voucher_id

    def stock_shards(self, voucher_id: int) -> int:
        """The voucher's stock buckets; 1 for a voucher the DB does not hold (its bucket is then missing in Redis and
        its load answers VOUCHER_NOT_FOUND)."""
        shards = self._shards.get(voucher_id)
        if shards is None:
            row = self.db.find(voucher_id)
            if row is None:
                return 1
            shards = self._shards[voucher_id] = row.stock_shards
        return shards

    def load(self, voucher_id: int, hold_until: int, hold_log: str = "") -> None:
        """Put every bucket of the voucher Redis does not hold into Redis from the DB (a no-op for those it holds).
        The row lock keeps writer commits out while the stocks, version and buyers are read and loaded together."""
        with self.db.transaction() as cur:
            snapshot = self._load(cur, voucher_id, hold_until, hold_log)
        self._retire_if_ended(voucher_id, snapshot)

    def _load(self, cur: Cursor, voucher_id: int, hold_until: int, hold_log: str = "") -> VoucherSnapshot:
        snapshot = self.db.lock_snapshot(cur, voucher_id)
        if snapshot is None:
            raise _not_found(voucher_id)
        for bucket in range(snapshot.shards):
            self.redis.load(
                voucher_id, snapshot, epoch=str(self.next_id()), hold_until=hold_until, hold_log=hold_log, bucket=bucket
            )
        return snapshot

    def _retire_if_ended(self, voucher_id: int, snapshot: VoucherSnapshot) -> None:
        if snapshot.end_at <= self.clock():
            self.retire(voucher_id, snapshot.shards)

    def retire(self, voucher_id: int, shards: int = 1) -> None:
        """An ended sale's keys leave Redis after FINISHED_KEYS_TTL_S (a late request reloads them, then ENDED)."""
        for bucket in range(shards):
            self.redis.expire(voucher_id, self.finished_keys_ttl_s, bucket)

    def rebuild(self, voucher_id: int) -> None:
        """Redis lost the voucher, or some of its buckets: orders acknowledged before the loss may still be on their
        way to the DB, so the buckets rebuilt sell nothing until the writer applied the log as it was (at least
        REBUILD_HOLD_S); the writer counts any such order into the rebuilt bucket when it lands."""
        self.load(voucher_id, hold_until=self.clock() + self.rebuild_hold_ms, hold_log=self.hold.rebuild_mark())

    def get_voucher(self, voucher_id: int) -> Voucher:
        row = self.db.find(voucher_id)
        if row is None:
            raise _not_found(voucher_id)
        buckets = range(row.stock_shards)
        read = [self.redis.stock_left(voucher_id, b) for b in buckets]
        if None in read:
            self.rebuild(voucher_id)
            read = [self.redis.stock_left(voucher_id, b) for b in buckets]
        stock_left = [stock for stock in read if stock is not None]
        if len(stock_left) < len(read):  # lost again right after its rebuild (a flush or failover meanwhile)
            raise RedisUnavailable(f"Redis lost voucher {voucher_id} again while it was read")
        return Voucher(
            voucher_id,
            row.title,
            row.initial_stock,
            sum(stock_left),
            row.initial_stock - row.stock,
            sum(self.redis.pending_count(voucher_id, b) for b in buckets),
            row.per_user_limit,
            row.begin_at,
            row.end_at,
            tuple(stock_left),
        )

    def per_user_limit(self, voucher_id: int) -> int:
        limit = self.redis.per_user_limit(voucher_id)
        if limit is None:
            row = self.db.find(voucher_id)
            if row is None:
                raise _not_found(voucher_id)
            limit = row.per_user_limit
        return limit

    def order(
        self, voucher_id: int, user_id: int, order_id: int | None = None, reserve: Callable[[int], object] | None = None
    ) -> VoucherOrder:
        """Take one unit for the buyer. `reserve(order_id)` runs before any effect (an Idempotency-Key's recovery
        point); `order_id`: the id an attempt that died under the same key reserved: its order, if the DB or Redis
        holds it, is the answer (voucher_order.lua answers a pending or settled id as itself), else it is taken now."""
        resumed = order_id is not None
        if order_id is not None:
            row = self.db.find_order(voucher_id, order_id)
            if row is not None:
                return VoucherOrder(order_id, voucher_id, row.user_id, row.seq, "PERSISTED")
            with self.db.transaction() as cur:
                if self.db.rolled_back(cur, [order_id]):  # taken back for good (PUBLISH_FAILED): a new order
                    order_id = None
        shards = self.stock_shards(voucher_id)
        home = home_bucket(user_id, shards)
        taken_id = order_id or self.next_id()  # the order's id from here on
        if reserve is not None:
            reserve(taken_id)
        now = self.clock()

        def outbound(order_id: int, reply: OrderReply) -> Outbound:
            event = VoucherOrderEvent(
                type="voucher_order",
                id=order_id,
                voucher_id=voucher_id,
                user_id=user_id,
                seq=reply.seq,
                ts=now,
                epoch=reply.epoch,
                bucket=reply.bucket,
                home=home,
            )
            return Outbound(
                keys.voucher_entity(voucher_id, reply.bucket),
                event.model_dump,
                lambda: self._undo(voucher_id, order_id, user_id, reply.bucket, home),
            )

        def attempt(_attempt_id: int) -> OrderReply:
            def answer_found_in_the_db() -> None:
                # the log as it was at the rebuild is applied now: the dead attempt's order, if it was published, is
                # in the DB and is the answer
                row = self.db.find_order(voucher_id, taken_id)
                if row is not None:
                    raise _Persisted(VoucherOrder(taken_id, voucher_id, row.user_id, row.seq, "PERSISTED"))

            reply = self._lifting_hold(
                voucher_id,
                home,
                lambda: self.redis.order(voucher_id, user_id, taken_id, now, home, shards),
                once_lifted=answer_found_in_the_db if resumed else None,
            )
            if reply.status is OrderStatus.AWAY:
                reply = self._take_elsewhere(voucher_id, user_id, taken_id, now, home, reply)
            return reply

        # every attempt of the loop (a reload between them) runs under the reserved id: a refused 'missing' took nothing
        try:
            _, reply = self.durability.apply(
                Step(
                    what=f"order of voucher {voucher_id}",
                    attempt=attempt,
                    reload=lambda: self.rebuild(voucher_id),
                    refusal=_refusal,
                    outbound=lambda _attempt_id, reply: outbound(taken_id, reply),
                    unknown=lambda _attempt_id, why: _order_unknown(voucher_id, taken_id, why),
                )
            )
        except _Persisted as persisted:
            return persisted.order
        return VoucherOrder(taken_id, voucher_id, user_id, reply.seq)

    def _lifting_hold(
        self,
        voucher_id: int,
        bucket: int,
        script: Callable[[], OrderReply],
        once_lifted: Callable[[], None] | None = None,
    ) -> OrderReply:
        """Run an order script on a bucket; a HELD answer makes this caller check the log hold (outbox/log_hold.py)
        and, once lifted, call `once_lifted` and run it again (the first call changed nothing)."""
        reply = script()
        if reply.status is OrderStatus.HELD and self.hold.passed(self.redis.hold_key(voucher_id, bucket)):
            if once_lifted is not None:
                once_lifted()
            reply = script()
        return reply

    def _take_elsewhere(
        self, voucher_id: int, user_id: int, order_id: int, now: int, home: int, away: OrderReply
    ) -> OrderReply:
        """The home bucket is empty and reserved the buyer's slot: take the unit from the first of the buckets it
        named that has one; when none has, give the slot back and answer SOLD_OUT (or RECOVERING when a bucket
        that may have one is being rebuilt). Buckets seen empty are marked so at home for SEEN_EMPTY_MS."""
        empty, waiting = [], None
        for bucket in away.probes:

            def take(bucket: int = bucket) -> OrderReply:
                return self.redis.take(voucher_id, bucket, user_id, order_id, now, away.seq, home)

            reply = self._lifting_hold(voucher_id, bucket, take)
            if (
                reply.missing
            ):  # Redis lost this bucket: rebuilt with its hold, it sells nothing until the log is applied
                self.rebuild(voucher_id)
                reply = take()
            if reply.status is OrderStatus.OK:
                return reply
            if reply.status is OrderStatus.SOLD_OUT:
                empty.append(bucket)
            else:
                waiting = reply
        self.redis.release(
            voucher_id, home, order_id, user_id, give_back=True, seen_empty=empty, empty_until=now + SEEN_EMPTY_MS
        )
        return waiting or OrderReply(OrderStatus.SOLD_OUT)

    def order_in_slot(self, voucher_id: int, user_id: int, seq: int) -> VoucherOrder | None:
        """The buyer's order in this slot (its n-th of the voucher), pending in Redis or in the DB: the same answer in
        both states. Redis first: the writer drops a pending order only after its DB commit, so one gone between the
        two reads is in the DB. Read on a refusal only (the pending orders are at most the stock not yet persisted)."""
        for pending in self.pending_orders(voucher_id):
            if (pending.user_id, pending.seq) == (user_id, seq):
                return VoucherOrder(pending.id, voucher_id, user_id, seq)
        row = self.db.find_slot(voucher_id, user_id, seq)
        return None if row is None else VoucherOrder(row.order_id, voucher_id, user_id, seq, "PERSISTED")

    def _undo(self, voucher_id: int, order_id: int, user_id: int, bucket: int, home: int) -> bool:
        """Take back an order whose event the broker did not acknowledge; True when it stands instead. The DB
        decides first, under the voucher row lock the writer persists under (persisted already: it stands;
        otherwise rolled back for good), and only then is the unit given back in Redis: one winner whatever
        Redis lost (the ledger's rule, ledger/service.py _undo; TigerBeetle's void vs post)."""
        if self.db.record_rollback(voucher_id, order_id):
            return True
        self.redis.rollback(voucher_id, order_id, user_id, bucket, home)
        return False

    def get_order(self, voucher_id: int, order_id: int) -> VoucherOrder:
        # the writer drops the pending record only after its DB commit: missing here means in the DB or never taken
        for bucket in range(self.stock_shards(voucher_id)):
            pending = self.redis.pending_order(voucher_id, order_id, bucket)
            if pending is not None:
                return VoucherOrder(order_id, voucher_id, pending.user_id, pending.seq)
        row = self.db.find_order(voucher_id, order_id)
        if row is not None:
            return VoucherOrder(order_id, voucher_id, row.user_id, row.seq, "PERSISTED")
        raise errors.OrderNotFound(f"order {order_id} of voucher {voucher_id} does not exist")

    def pending_orders(self, voucher_id: int) -> list[VoucherOrderEvent]:
        return [
            e for bucket in range(self.stock_shards(voucher_id)) for e in self.redis.pending_orders(voucher_id, bucket)
        ]
