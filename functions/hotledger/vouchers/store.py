"""Vouchers' storage. VoucherDb: every SQL statement on t_seckill_voucher / t_voucher_order. VoucherRedis: the
voucher's Redis keys (tagged {v<id>}: one slot per voucher), read directly or changed through one typed wrapper
per voucher_*.lua script. Nothing above this module knows a table, a key, a KEYS/ARGV order or a reply array.

Redis keys of a voucher: its hash (stock, begin, end, limit, epoch, hold_until, db_version), its buyers (user id ->
orders taken), its pending orders (order id -> 'user;seq;ts;epoch' until the writer persisted it) and one fate key
per order ('claimed' by the writer | 'rolledback' by the API)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, expire_once, redis_errors_translated, reply_fields, text
from hotledger.outbox.events import VoucherOrderEvent

Slot = tuple[int, int, int]
"""(voucher id, user id, seq): the buyer's n-th order of a voucher, held by at most one order."""


def voucher_keys(voucher_id: int) -> list[str]:
    return [keys.voucher(voucher_id), keys.voucher_buyers(voucher_id), keys.voucher_pending(voucher_id)]


# ---------------------------------------------------------------------------------------------------- DB rows
@dataclass(frozen=True)
class VoucherRow:
    voucher_id: int
    title: str
    initial_stock: int
    stock: int  # left in the DB: initial stock - orders persisted
    per_user_limit: int
    begin_at: int  # epoch ms
    end_at: int


@dataclass(frozen=True)
class VoucherSnapshot:
    """What voucher_load puts into Redis, read with the voucher row locked (no writer commit in between)."""

    stock: int
    begin_at: int
    end_at: int
    per_user_limit: int
    version: int  # the row's version: orders committed later are not in `stock`
    buyers: dict[int, int] = field(default_factory=dict)  # user id -> orders persisted


@dataclass(frozen=True)
class StockRow:
    stock: int
    version: int


@dataclass(frozen=True)
class OrderRow:
    order_id: int
    voucher_id: int
    user_id: int
    seq: int

    @property
    def slot(self) -> Slot:
        return self.voucher_id, self.user_id, self.seq


def _in(values: list) -> str:
    return ",".join(["%s"] * len(values))


class VoucherDb:
    """Reads outside a transaction run on their own; the others take the cursor of `transaction()`."""

    @staticmethod
    def transaction() -> contextlib.AbstractContextManager:
        return db.transaction()

    @staticmethod
    def create(cur, title: str, stock: int, per_user_limit: int, begin_at: int, end_at: int) -> int:
        cur.execute("INSERT INTO t_seckill_voucher (title, initial_stock, stock, per_user_limit, begin_time, end_time)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (title, stock, stock, per_user_limit, db.to_datetime(begin_at), db.to_datetime(end_at)))
        return cur.lastrowid

    @staticmethod
    def find(voucher_id: int) -> VoucherRow | None:
        rows = db.query("SELECT title, initial_stock, stock, per_user_limit, begin_time, end_time FROM t_seckill_voucher"
                        " WHERE id = %s", (voucher_id,))
        if not rows:
            return None
        title, initial, stock, limit, begin, end = rows[0]
        return VoucherRow(voucher_id, title, initial, stock, limit, db.to_ms(begin), db.to_ms(end))

    @staticmethod
    def find_order(voucher_id: int, order_id: int) -> OrderRow | None:
        rows = db.query("SELECT user_id, seq FROM t_voucher_order WHERE id = %s AND voucher_id = %s", (order_id, voucher_id))
        return OrderRow(order_id, voucher_id, rows[0][0], rows[0][1]) if rows else None

    @staticmethod
    def ending_after(moment_ms: int, after_id: int = 0, limit: int = 2**62) -> list[tuple[int, int]]:
        """(voucher id, end in epoch ms) of the vouchers whose sale ends after this moment, by id: the next page
        after `after_id`."""
        rows = db.query("SELECT id, end_time FROM t_seckill_voucher WHERE end_time > %s AND id > %s ORDER BY id LIMIT %s",
                        (db.to_datetime(moment_ms), after_id, limit))
        return [(voucher_id, db.to_ms(end)) for voucher_id, end in rows]

    @staticmethod
    def lock_snapshot(cur, voucher_id: int) -> VoucherSnapshot | None:
        cur.execute("SELECT stock, begin_time, end_time, per_user_limit, version FROM t_seckill_voucher WHERE id = %s"
                    " FOR UPDATE", (voucher_id,))
        row = cur.fetchone()
        if row is None:
            return None
        stock, begin, end, limit, version = row
        cur.execute("SELECT user_id, COUNT(*) FROM t_voucher_order WHERE voucher_id = %s GROUP BY user_id", (voucher_id,))
        return VoucherSnapshot(stock, db.to_ms(begin), db.to_ms(end), limit, version, dict(cur.fetchall()))

    @staticmethod
    def lock_stocks(cur, voucher_ids: Iterable[int]) -> dict[int, StockRow]:
        """Lock the voucher rows in id order (no deadlock between writers); the ids that exist -> stock, version."""
        ordered = sorted(set(voucher_ids))
        if not ordered:
            return {}
        cur.execute(f"SELECT id, stock, version FROM t_seckill_voucher WHERE id IN ({_in(ordered)}) ORDER BY id FOR UPDATE",
                    ordered)
        return {voucher_id: StockRow(stock, version) for voucher_id, stock, version in cur.fetchall()}

    @staticmethod
    def orders_by_id(cur, order_ids: list[int]) -> dict[int, OrderRow]:
        """The orders the DB holds among these ids."""
        if not order_ids:
            return {}
        cur.execute(f"SELECT id, voucher_id, user_id, seq FROM t_voucher_order WHERE id IN ({_in(order_ids)})", order_ids)
        return {row[0]: OrderRow(*row) for row in cur.fetchall()}

    @staticmethod
    def record_rollback(voucher_id: int, order_id: int) -> bool:
        """The DB's verdict on an order whose event the broker did not acknowledge, under the voucher's row lock
        (the lock the writer persists under): False when it is now rolled back for good (t_rolled_back: never
        persisted, whatever Redis kept and however late its event); True when the writer persisted it first.
        Raises db.DatabaseUnavailable when no verdict is known."""
        with db.transaction() as cur:
            cur.execute("SELECT 1 FROM t_seckill_voucher WHERE id = %s FOR UPDATE", (voucher_id,))
            cur.execute("SELECT 1 FROM t_voucher_order WHERE id = %s", (order_id,))
            if cur.fetchone() is not None:
                return True
            cur.execute("INSERT IGNORE INTO t_rolled_back (change_id, feature, owner_id) VALUES (%s, 'voucher', %s)",
                        (order_id, voucher_id))
        return False

    @staticmethod
    def rolled_back(cur, order_ids: list[int]) -> set[int]:
        """Those of the orders rolled back for good, read under the voucher row locks the caller holds."""
        if not order_ids:
            return set()
        cur.execute(f"SELECT change_id FROM t_rolled_back WHERE change_id IN ({_in(order_ids)})", order_ids)
        return {row[0] for row in cur.fetchall()}

    @staticmethod
    def slot_holders(cur, slots: list[Slot]) -> dict[Slot, int]:
        """slot -> id of the order the DB holds in it, for the slots taken among these."""
        if not slots:
            return {}
        cur.execute("SELECT voucher_id, user_id, seq, id FROM t_voucher_order WHERE (voucher_id, user_id, seq) IN ("
                    + ",".join(["(%s,%s,%s)"] * len(slots)) + ")", [x for slot in slots for x in slot])
        return {tuple(row[:3]): row[3] for row in cur.fetchall()}

    @staticmethod
    def insert_orders(cur, orders: list[VoucherOrderEvent]) -> None:
        if orders:
            # every value is a validated int: formatted directly, far cheaper than the driver's escaping per row
            cur.execute("INSERT INTO t_voucher_order (id, voucher_id, user_id, seq, create_time) VALUES "
                        + ",".join("(%d,%d,%d,%d,FROM_UNIXTIME(%d/1000))" % (e.id, e.voucher_id, e.user_id, e.seq, e.ts)
                                   for e in orders))

    @staticmethod
    def take_stock(cur, sold: dict[int, int]) -> None:
        """Move each voucher's DB stock down by the orders sold; its version rises by one per call."""
        for voucher_id, n in sold.items():
            cur.execute("UPDATE t_seckill_voucher SET stock = stock - %s, version = version + 1 WHERE id = %s", (n, voucher_id))


# ---------------------------------------------------------------------------------------------- script replies
class OrderStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    RECOVERING = "recovering"
    NOT_STARTED = "not_started"
    ENDED = "ended"
    SOLD_OUT = "sold_out"
    ALREADY = "already"


@dataclass(frozen=True)
class OrderReply:
    """voucher_order.lua's answer. `seq`/`epoch` when OK; `at` is the begin, end or retry time of a refusal."""

    status: OrderStatus
    seq: int = 0
    epoch: str = ""
    at: str = ""

    @property
    def missing(self) -> bool:
        return self.status is OrderStatus.MISSING

    @classmethod
    def parse(cls, raw) -> OrderReply:
        status, *rest = reply_fields(raw)
        status = OrderStatus(status)
        if status is OrderStatus.OK:
            return cls(status, seq=int(rest[0]), epoch=rest[1])
        return cls(status, at=rest[0] if rest and status is not OrderStatus.ALREADY else "")


@dataclass(frozen=True)
class SettleReply:
    """voucher_settle.lua's answer for one voucher."""

    removed: int  # orders dropped from pending
    counted_late: int  # orders of an earlier load, counted into the rebuilt stock now


class ReconcileStatus(Enum):
    MISSING = "missing"
    SAME = "same"
    CORRECTED = "corrected"


@dataclass(frozen=True)
class ReconcileReply:
    """voucher_reconcile.lua's answer: the Redis stock found and the one it holds now."""

    status: ReconcileStatus
    stock_before: int = 0
    stock_after: int = 0

    @classmethod
    def parse(cls, raw) -> ReconcileReply:
        status, *rest = reply_fields(raw)
        status = ReconcileStatus(status)
        if status is ReconcileStatus.SAME:
            return cls(status, int(rest[0]), int(rest[0]))
        if status is ReconcileStatus.CORRECTED:
            return cls(status, int(rest[0]), int(rest[1]))
        return cls(status)


def _pending_order(voucher_id: int, order_id, value) -> VoucherOrderEvent:
    user_id, seq, ts, epoch = text(value).split(";")
    return VoucherOrderEvent(type="voucher_order", id=int(order_id), voucher_id=voucher_id, user_id=int(user_id),
                             seq=int(seq), ts=int(ts), epoch=epoch)


@redis_errors_translated
class VoucherRedis:
    def __init__(self, lua: Lua, stream_flag: str, fate_ttl_s: int):
        self.lua, self.redis, self.stream_flag, self.fate_ttl_s = lua, lua.client, stream_flag, fate_ttl_s

    # scripts
    def order(self, voucher_id: int, user_id: int, order_id: int, now_ms: int) -> OrderReply:
        return OrderReply.parse(self.lua.run("voucher_order", [*voucher_keys(voucher_id), keys.voucher_stream(voucher_id)],
                                             [voucher_id, user_id, order_id, now_ms, self.stream_flag]))

    def rollback(self, voucher_id: int, order_id: int, user_id: int) -> None:
        """Give back in Redis an order the DB recorded as rolled back (VoucherDb.record_rollback)."""
        self.lua.run("voucher_rollback", [*voucher_keys(voucher_id), keys.voucher_fate(voucher_id, order_id)],
                     [order_id, user_id, self.fate_ttl_s])

    def load(self, voucher_id: int, snapshot: VoucherSnapshot, epoch: str, hold_until: int) -> bool:
        """Put the voucher into Redis unless Redis holds it (True when loaded). Orders taken from this load carry
        `epoch`; until `hold_until` (epoch ms) they answer RECOVERING."""
        buyers = [x for pair in snapshot.buyers.items() for x in pair]
        return self.lua.run("voucher_load", voucher_keys(voucher_id)[:2], [
            snapshot.stock, snapshot.begin_at, snapshot.end_at, snapshot.per_user_limit, epoch, hold_until, snapshot.version,
            *buyers]) == 1

    def settle(self, versions: dict[int, int], orders: list[VoucherOrderEvent]) -> dict[int, SettleReply]:
        """After the writer's commit: drop the persisted orders from pending (one script per voucher, pipelined).
        `versions`: voucher id -> the DB version the commit produced (0, or absent: counts nothing late)."""
        by_voucher: dict[int, list[VoucherOrderEvent]] = {}
        for e in orders:
            by_voucher.setdefault(e.voucher_id, []).append(e)
        if not by_voucher:
            return {}
        pipe = self.lua.pipeline()
        for voucher_id, group in by_voucher.items():
            self.lua.run("voucher_settle", voucher_keys(voucher_id), [
                versions.get(voucher_id, 0), *(x for e in group for x in (e.id, e.user_id, e.epoch))], client=pipe)
        return {voucher_id: SettleReply(int(removed), int(late)) for voucher_id, (removed, late) in zip(by_voucher, pipe.execute())}

    def reconcile(self, voucher_id: int, db_stock: int, persisted: list[int]) -> ReconcileReply:
        """Make Redis stock = DB stock - orders pending, after dropping the pending orders the DB holds (their
        settle was lost). Run with the voucher row locked."""
        return ReconcileReply.parse(self.lua.run("voucher_reconcile", [keys.voucher(voucher_id), keys.voucher_pending(voucher_id)],
                                                 [db_stock, *persisted]))

    # reads and expiry
    def stock_left(self, voucher_id: int) -> int | None:
        """None when Redis does not hold the voucher."""
        stock = self.redis.hget(keys.voucher(voucher_id), "stock")
        return None if stock is None else int(stock)

    def pending_count(self, voucher_id: int) -> int:
        return self.redis.hlen(keys.voucher_pending(voucher_id))

    def pending_ids(self, voucher_id: int) -> list[int]:
        return [int(text(order_id)) for order_id in self.redis.hkeys(keys.voucher_pending(voucher_id))]

    def pending_order(self, voucher_id: int, order_id: int) -> VoucherOrderEvent | None:
        value = self.redis.hget(keys.voucher_pending(voucher_id), str(order_id))
        return None if value is None else _pending_order(voucher_id, order_id, value)

    def pending_orders(self, voucher_id: int) -> list[VoucherOrderEvent]:
        """The orders taken in Redis and not yet in the DB, as the events that carry them."""
        return [_pending_order(voucher_id, order_id, value)
                for order_id, value in self.redis.hgetall(keys.voucher_pending(voucher_id)).items()]

    def expire(self, voucher_id: int, ttl_s: int) -> None:
        """Give the voucher's keys a TTL unless they have one."""
        expire_once(self.redis, voucher_keys(voucher_id), ttl_s)
