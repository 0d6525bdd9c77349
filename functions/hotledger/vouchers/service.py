"""Vouchers (flash sales).

A voucher lives in the DB and is loaded into Redis, where its stock is sold: an order is one script (time
window, stock, per-user limit, decrement, buyer record, pending order), made durable by the configured
transport before the answer (Durability.apply). The writer (persist.py) inserts the orders and moves the DB
stock in one transaction per batch; the reconciler (reconcile.py) keeps
Redis stock + orders pending in Redis + sold in the DB = initial stock.

Invariants:
- Redis never sells below zero; the DB never sells below zero either (an order beyond the DB stock is
  dead-lettered, not inserted);
- a buyer holds at most per_user_limit orders, each in its own slot (seq 1, 2, ...);
- a voucher Redis does not hold is loaded from the DB before any order runs on it. After a loss (rebuild),
  sales wait REBUILD_HOLD_S so orders acknowledged before the loss land first; the writer counts those into
  the rebuilt stock when they arrive;
- an ended sale's keys leave Redis FINISHED_KEYS_TTL_S after it ends and nothing is pending (a late request
  reloads them and is refused ENDED).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hotledger import errors
from hotledger.config import Settings
from hotledger.outbox.durable import Durability, Outbound
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.vouchers.store import OrderReply, OrderStatus, VoucherDb, VoucherRedis, VoucherSnapshot


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
        "trying again", entry_id=str(order_id))


_REFUSALS = {
    OrderStatus.RECOVERING: lambda at: errors.Recovering("the sale is being restored after a cache failure; retry in a few "
                                                         "seconds", retry_at=at),
    OrderStatus.NOT_STARTED: lambda at: errors.NotStarted("the sale has not started yet", begin_at=at),
    OrderStatus.ENDED: lambda at: errors.Ended("the sale has ended", end_at=at),
    OrderStatus.SOLD_OUT: lambda at: errors.SoldOut("the voucher is sold out"),
    OrderStatus.ALREADY: lambda at: errors.AlreadyOrdered("this user already holds the most orders of this voucher allowed "
                                                          "per user"),
}


def _refusal(reply: OrderReply) -> errors.DomainError | None:
    refuse = _REFUSALS.get(reply.status)
    return refuse(reply.at) if refuse else None


def _not_found(voucher_id: int) -> errors.DomainError:
    return errors.VoucherNotFound(f"voucher {voucher_id} does not exist")


class Vouchers:
    def __init__(self, cfg: Settings, db: VoucherDb, redis: VoucherRedis, durability: Durability, next_id: Callable[[], int],
                 clock: Callable[[], int] = wall_clock_ms):
        self.db, self.redis, self.durability, self.next_id, self.clock = db, redis, durability, next_id, clock
        self.rebuild_hold_ms, self.finished_keys_ttl_s = cfg.rebuild_hold_s * 1000, cfg.finished_keys_ttl_s

    def create_voucher(self, title: str, stock: int, begin_at: int, end_at: int, per_user_limit: int) -> int:
        # inserted and loaded into Redis in one transaction: nobody (the reconciler) sees the row before Redis holds
        # the voucher, so a new voucher is never taken for one Redis lost and rebuilt with a hold
        with self.db.transaction() as cur:
            voucher_id = self.db.create(cur, title, stock, per_user_limit, begin_at, end_at)
            snapshot = self._load(cur, voucher_id, hold_until=0)
        self._retire_if_ended(voucher_id, snapshot)
        return voucher_id

    def load(self, voucher_id: int, hold_until: int) -> None:
        """Put the voucher into Redis from the DB (no-op when Redis holds it). The row lock keeps writer commits
        out while the stock, version and buyers are read and loaded together."""
        with self.db.transaction() as cur:
            snapshot = self._load(cur, voucher_id, hold_until)
        self._retire_if_ended(voucher_id, snapshot)

    def _load(self, cur, voucher_id: int, hold_until: int) -> VoucherSnapshot:
        snapshot = self.db.lock_snapshot(cur, voucher_id)
        if snapshot is None:
            raise _not_found(voucher_id)
        self.redis.load(voucher_id, snapshot, epoch=str(self.next_id()), hold_until=hold_until)
        return snapshot

    def _retire_if_ended(self, voucher_id: int, snapshot: VoucherSnapshot) -> None:
        if snapshot.end_at <= self.clock():
            self.retire(voucher_id)

    def retire(self, voucher_id: int) -> None:
        """An ended sale's keys leave Redis after FINISHED_KEYS_TTL_S (a late request reloads them, then ENDED)."""
        self.redis.expire(voucher_id, self.finished_keys_ttl_s)

    def rebuild(self, voucher_id: int) -> None:
        """Redis lost the voucher: orders acknowledged before the loss may still be on their way to the DB,
        so sales wait REBUILD_HOLD_S; the writer counts any such order into the rebuilt stock when it lands."""
        self.load(voucher_id, hold_until=self.clock() + self.rebuild_hold_ms)

    def get_voucher(self, voucher_id: int) -> Voucher:
        row = self.db.find(voucher_id)
        if row is None:
            raise _not_found(voucher_id)
        stock_left = self.redis.stock_left(voucher_id)
        if stock_left is None:
            self.rebuild(voucher_id)
            stock_left = self.redis.stock_left(voucher_id)
        return Voucher(voucher_id, row.title, row.initial_stock, stock_left, row.initial_stock - row.stock,
                       self.redis.pending_count(voucher_id), row.per_user_limit, row.begin_at, row.end_at)

    def order(self, voucher_id: int, user_id: int) -> VoucherOrder:
        now = self.clock()

        def outbound(order_id: int, reply: OrderReply) -> Outbound:
            event = VoucherOrderEvent(type="voucher_order", id=order_id, voucher_id=voucher_id, user_id=user_id,
                                      seq=reply.seq, ts=now, epoch=reply.epoch)
            return Outbound(f"v{voucher_id}", event.model_dump, lambda: self._undo(voucher_id, order_id, user_id))

        order_id, reply = self.durability.apply(
            lambda order_id: self.redis.order(voucher_id, user_id, order_id, now), reload=lambda: self.rebuild(voucher_id),
            refusal=_refusal, outbound=outbound, unknown=lambda order_id, why: _order_unknown(voucher_id, order_id, why),
            what=f"order of voucher {voucher_id}")
        return VoucherOrder(order_id, voucher_id, user_id, reply.seq)

    def _undo(self, voucher_id: int, order_id: int, user_id: int) -> bool:
        """Take back an order whose event the broker did not acknowledge; True when it stands instead. The DB
        decides first, under the voucher row lock the writer persists under (persisted already: it stands;
        otherwise rolled back for good), and only then is the unit given back in Redis: one winner whatever
        Redis lost (the ledger's rule, ledger/service.py _undo; TigerBeetle's void vs post)."""
        if self.db.record_rollback(voucher_id, order_id):
            return True
        self.redis.rollback(voucher_id, order_id, user_id)
        return False

    def get_order(self, voucher_id: int, order_id: int) -> VoucherOrder:
        # the writer drops the pending record only after its DB commit: missing here means in the DB or never taken
        pending = self.redis.pending_order(voucher_id, order_id)
        if pending is not None:
            return VoucherOrder(order_id, voucher_id, pending.user_id, pending.seq)
        row = self.db.find_order(voucher_id, order_id)
        if row is not None:
            return VoucherOrder(order_id, voucher_id, row.user_id, row.seq, "PERSISTED")
        raise errors.OrderNotFound(f"order {order_id} of voucher {voucher_id} does not exist")

    def pending_orders(self, voucher_id: int) -> list[VoucherOrderEvent]:
        return self.redis.pending_orders(voucher_id)
