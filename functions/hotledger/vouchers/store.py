"""Vouchers' storage. VoucherDb: every SQL statement on t_seckill_voucher / t_voucher_bucket / t_voucher_order.
VoucherRedis: the voucher's Redis keys, read directly or changed through one typed wrapper per voucher_*.lua script.
Nothing above this module knows a table, a key, a KEYS/ARGV order or a reply array.

A voucher sells from stock_shards stock buckets, each one Redis slot (tagged {v<id>} for bucket 0, {v<id>:b<k>} for
bucket k; keys.py). Keys of a bucket: its hash (stock, begin, end, limit, epoch, hold_until, db_version, hold_log,
dry:<k>), its buyers (user id -> orders taken, for the buyers whose home it is), its pending orders (order id ->
'user;seq;ts;epoch;home' for units taken here until the writer persisted them), its away reservations (order id ->
'user;seq;ts' for buyers homed here whose unit comes from another bucket) and one fate key per order of its units
('claimed' by the writer | 'rolledback' by the API)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, expire_once, redis_errors_translated, reply_fields, text
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.vouchers.replies import OrderReply, ReconcileReply, SettleReply
from hotledger.vouchers.rows import AwayOrder, OrderRow, Slot, StockRow, VoucherRow, VoucherSnapshot

if TYPE_CHECKING:
    from pymysql.cursors import Cursor as Cursor  # a transaction's, handed to VoucherDb (re-exported for its callers)

"""(voucher id, user id, seq): the buyer's n-th order of a voucher, held by at most one order."""


def voucher_keys(voucher_id: int, bucket: int = 0) -> list[str]:
    return [
        keys.voucher(voucher_id, bucket),
        keys.voucher_buyers(voucher_id, bucket),
        keys.voucher_pending(voucher_id, bucket),
    ]


def bucket_shares(stock: int, shards: int) -> list[int]:
    """The stock split over the buckets as evenly as possible (the first ones take the remainder)."""
    return [stock // shards + (1 if k < stock % shards else 0) for k in range(shards)]


def _in(values: Sequence[object]) -> str:
    return ",".join(["%s"] * len(values))


class VoucherDb:
    """Reads outside a transaction run on their own; the others take the cursor of `transaction()`."""

    @staticmethod
    def transaction() -> contextlib.AbstractContextManager[Cursor]:
        return db.transaction()

    @staticmethod
    def create(
        cur: Cursor, title: str, stock: int, per_user_limit: int, begin_at: int, end_at: int, stock_shards: int = 1
    ) -> int:
        cur.execute(
            "INSERT INTO t_seckill_voucher (title, initial_stock, stock, per_user_limit, begin_time, end_time,"
            " stock_shards) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (title, stock, stock, per_user_limit, db.to_datetime(begin_at), db.to_datetime(end_at), stock_shards),
        )
        voucher_id = int(cur.lastrowid)
        cur.executemany(
            "INSERT INTO t_voucher_bucket (voucher_id, bucket, stock) VALUES (%s, %s, %s)",
            [(voucher_id, k, share) for k, share in enumerate(bucket_shares(stock, stock_shards))],
        )
        return voucher_id

    @staticmethod
    def find(voucher_id: int) -> VoucherRow | None:
        rows = db.query(
            "SELECT title, initial_stock, stock, per_user_limit, begin_time, end_time, stock_shards"
            " FROM t_seckill_voucher WHERE id = %s",
            (voucher_id,),
        )
        if not rows:
            return None
        title, initial, stock, limit, begin, end, shards = rows[0]
        return VoucherRow(voucher_id, title, initial, stock, limit, db.to_ms(begin), db.to_ms(end), shards)

    @staticmethod
    def find_order(voucher_id: int, order_id: int) -> OrderRow | None:
        rows = db.query(
            "SELECT user_id, seq FROM t_voucher_order WHERE id = %s AND voucher_id = %s", (order_id, voucher_id)
        )
        return OrderRow(order_id, voucher_id, rows[0][0], rows[0][1]) if rows else None

    @staticmethod
    def find_slot(voucher_id: int, user_id: int, seq: int) -> OrderRow | None:
        rows = db.query(
            "SELECT id FROM t_voucher_order WHERE voucher_id = %s AND user_id = %s AND seq = %s",
            (voucher_id, user_id, seq),
        )
        return OrderRow(rows[0][0], voucher_id, user_id, seq) if rows else None

    @staticmethod
    def ending_after(moment_ms: int, after_id: int = 0, limit: int = 2**62) -> list[tuple[int, int, int]]:
        """(voucher id, end in epoch ms, stock buckets) of the vouchers whose sale ends after this moment, by id: the
        next page after `after_id`."""
        rows = db.query(
            "SELECT id, end_time, stock_shards FROM t_seckill_voucher WHERE end_time > %s AND id > %s"
            " ORDER BY id LIMIT %s",
            (db.to_datetime(moment_ms), after_id, limit),
        )
        return [(voucher_id, db.to_ms(end), shards) for voucher_id, end, shards in rows]

    @staticmethod
    def lock_snapshot(cur: Cursor, voucher_id: int) -> VoucherSnapshot | None:
        cur.execute(
            "SELECT stock, begin_time, end_time, per_user_limit, version FROM t_seckill_voucher WHERE id = %s"
            " FOR UPDATE",
            (voucher_id,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        stock, begin, end, limit, version = row
        cur.execute(
            "SELECT user_id, COUNT(*) FROM t_voucher_order WHERE voucher_id = %s GROUP BY user_id", (voucher_id,)
        )
        buyers = dict(cur.fetchall())
        return VoucherSnapshot(
            stock,
            db.to_ms(begin),
            db.to_ms(end),
            limit,
            version,
            buyers,
            tuple(VoucherDb.bucket_stocks(cur, voucher_id)),
        )

    @staticmethod
    def bucket_stocks(cur: Cursor, voucher_id: int) -> list[int]:
        """The stock left in the DB of each of the voucher's buckets (bucket order), read under its row lock."""
        cur.execute("SELECT stock FROM t_voucher_bucket WHERE voucher_id = %s ORDER BY bucket", (voucher_id,))
        return [row[0] for row in cur.fetchall()]

    @staticmethod
    def lock_stocks(cur: Cursor, voucher_ids: Iterable[int]) -> dict[int, StockRow]:
        """Lock the voucher rows in id order (no deadlock between writers); the ids that exist -> stock, version."""
        ordered = sorted(set(voucher_ids))
        if not ordered:
            return {}
        cur.execute(
            f"SELECT id, stock, version FROM t_seckill_voucher WHERE id IN ({_in(ordered)}) ORDER BY id FOR UPDATE",
            ordered,
        )
        return {voucher_id: StockRow(stock, version) for voucher_id, stock, version in cur.fetchall()}

    @staticmethod
    def orders_by_id(cur: Cursor, order_ids: list[int]) -> dict[int, OrderRow]:
        """The orders the DB holds among these ids."""
        if not order_ids:
            return {}
        cur.execute(
            f"SELECT id, voucher_id, user_id, seq FROM t_voucher_order WHERE id IN ({_in(order_ids)})", order_ids
        )
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
            cur.execute(
                "INSERT IGNORE INTO t_rolled_back (change_id, feature, owner_id) VALUES (%s, 'voucher', %s)",
                (order_id, voucher_id),
            )
        return False

    @staticmethod
    def rolled_back(cur: Cursor, order_ids: list[int]) -> set[int]:
        """Those of the orders rolled back for good, read under the voucher row locks the caller holds."""
        if not order_ids:
            return set()
        cur.execute(f"SELECT change_id FROM t_rolled_back WHERE change_id IN ({_in(order_ids)})", order_ids)
        return {row[0] for row in cur.fetchall()}

    @staticmethod
    def slot_holders(cur: Cursor, slots: list[Slot]) -> dict[Slot, int]:
        """slot -> id of the order the DB holds in it, for the slots taken among these."""
        if not slots:
            return {}
        cur.execute(
            "SELECT voucher_id, user_id, seq, id FROM t_voucher_order WHERE (voucher_id, user_id, seq) IN ("
            + ",".join(["(%s,%s,%s)"] * len(slots))
            + ")",
            [x for slot in slots for x in slot],
        )
        return {tuple(row[:3]): row[3] for row in cur.fetchall()}

    @staticmethod
    def insert_orders(cur: Cursor, orders: list[VoucherOrderEvent]) -> None:
        if orders:
            # every value is a validated int: formatted directly, far cheaper than the driver's escaping per row
            cur.execute(
                "INSERT INTO t_voucher_order (id, voucher_id, user_id, seq, bucket, create_time) VALUES "
                + ",".join(
                    "(%d,%d,%d,%d,%d,FROM_UNIXTIME(%d/1000))" % (e.id, e.voucher_id, e.user_id, e.seq, e.bucket, e.ts)
                    for e in orders
                )
            )

    @staticmethod
    def take_stock(cur: Cursor, sold: Counter[tuple[int, int]]) -> None:
        """Move each voucher's DB stock, and each of its buckets', down by the orders sold ((voucher id, bucket) ->
        orders); the voucher's version rises by one per call."""
        per_voucher: Counter[int] = Counter()
        for (voucher_id, bucket), n in sold.items():
            per_voucher[voucher_id] += n
            cur.execute(
                "UPDATE t_voucher_bucket SET stock = stock - %s WHERE voucher_id = %s AND bucket = %s",
                (n, voucher_id, bucket),
            )
        for voucher_id, n in per_voucher.items():
            cur.execute(
                "UPDATE t_seckill_voucher SET stock = stock - %s, version = version + 1 WHERE id = %s", (n, voucher_id)
            )


def _pending_order(voucher_id: int, order_id: bytes | str | int, value: bytes | str, bucket: int) -> VoucherOrderEvent:
    user_id, seq, ts, epoch, *home = text(value).split(";")  # 'home' absent: taken before stock buckets, bucket 0
    return VoucherOrderEvent(
        type="voucher_order",
        id=int(order_id),
        voucher_id=voucher_id,
        user_id=int(user_id),
        seq=int(seq),
        ts=int(ts),
        epoch=epoch,
        bucket=bucket,
        home=int(home[0]) if home else bucket,
    )


def _settle_roles(e: VoucherOrderEvent) -> list[tuple[int, str]]:
    """(bucket, role) of the slots an order's settle runs in: its unit's bucket, and its buyer's home if another."""
    if e.bucket == e.home:
        return [(e.bucket, "own")]
    return [(e.bucket, "unit"), (e.home, "buyer")]


@redis_errors_translated
class VoucherRedis:
    def __init__(self, lua: Lua, stream_flag: str, fate_ttl_s: int):
        self.lua, self.redis, self.stream_flag, self.fate_ttl_s = lua, lua.client, stream_flag, fate_ttl_s

    # scripts
    def order(
        self, voucher_id: int, user_id: int, order_id: int, now_ms: int, home: int = 0, shards: int = 1
    ) -> OrderReply:
        """Take a unit in the buyer's home bucket, or reserve the buyer's slot there (AWAY) when it is empty."""
        return OrderReply.parse(
            self.lua.run(
                "voucher_order",
                [
                    *voucher_keys(voucher_id, home),
                    keys.voucher_stream(voucher_id, home),
                    keys.voucher_away(voucher_id, home),
                ],
                [voucher_id, user_id, order_id, now_ms, self.stream_flag, home, shards],
            )
        )

    def take(
        self, voucher_id: int, bucket: int, user_id: int, order_id: int, now_ms: int, seq: int, home: int
    ) -> OrderReply:
        """Take the unit of an AWAY order from this bucket (OK, SOLD_OUT, MISSING, RECOVERING or HELD)."""
        return OrderReply.parse_take(
            self.lua.run(
                "voucher_take",
                [*voucher_keys(voucher_id, bucket), keys.voucher_stream(voucher_id, bucket)],
                [voucher_id, user_id, order_id, now_ms, self.stream_flag, seq, home, bucket],
            ),
            seq,
            bucket,
        )

    def release(
        self,
        voucher_id: int,
        home: int,
        order_id: int,
        user_id: int,
        give_back: bool,
        seen_empty: Iterable[int] = (),
        empty_until: int = 0,
    ) -> bool:
        """End an AWAY reservation (give_back: the buyer's slot is freed; else the order stands); buckets in
        `seen_empty` are skipped by this home's buyers until `empty_until`. True when the reservation was there."""
        status: str = reply_fields(
            self.lua.run(
                "voucher_release",
                [
                    keys.voucher(voucher_id, home),
                    keys.voucher_buyers(voucher_id, home),
                    keys.voucher_away(voucher_id, home),
                ],
                [order_id, user_id, "give_back" if give_back else "keep", empty_until, *seen_empty],
            )
        )[0]
        return status == "released"

    def rollback(self, voucher_id: int, order_id: int, user_id: int, bucket: int = 0, home: int = 0) -> None:
        """Give back in Redis an order the DB recorded as rolled back (VoucherDb.record_rollback): its unit in its
        bucket, its buyer's slot in the buyer's home."""
        self.lua.run(
            "voucher_rollback",
            [*voucher_keys(voucher_id, bucket), keys.voucher_fate(voucher_id, order_id, bucket)],
            [order_id, user_id, self.fate_ttl_s, "1" if bucket == home else ""],
        )
        if bucket != home:
            self.release(voucher_id, home, order_id, user_id, give_back=True)

    def load(
        self,
        voucher_id: int,
        snapshot: VoucherSnapshot,
        epoch: str,
        hold_until: int,
        hold_log: str = "",
        bucket: int = 0,
    ) -> bool:
        """Put the voucher's bucket into Redis unless Redis holds it (True when loaded). Orders taken from this load
        carry `epoch`; until `hold_until` (epoch ms) they answer RECOVERING, and while `hold_log` is set ('' : no log
        hold) one a second answers HELD."""
        buyers = [x for pair in snapshot.bucket_buyers(bucket).items() for x in pair]
        return (
            int(
                self.lua.run(
                    "voucher_load",
                    [*voucher_keys(voucher_id, bucket)[:2], keys.voucher_away(voucher_id, bucket)],
                    [
                        snapshot.bucket_stock(bucket),
                        snapshot.begin_at,
                        snapshot.end_at,
                        snapshot.per_user_limit,
                        epoch,
                        hold_until,
                        snapshot.version,
                        hold_log,
                        *buyers,
                    ],
                )
            )
            == 1
        )

    @staticmethod
    def hold_key(voucher_id: int, bucket: int = 0) -> str:
        """The hash a rebuild's log hold lives in (outbox/log_hold.py)."""
        return keys.voucher(voucher_id, bucket)

    def settle(self, versions: dict[int, int], orders: list[VoucherOrderEvent]) -> dict[tuple[int, int], SettleReply]:
        """After the writer's commit: drop the persisted orders from pending (and their buyers' away reservations),
        one script per bucket, pipelined. `versions`: voucher id -> the DB version the commit produced (0, or
        absent: counts nothing late)."""
        by_bucket: dict[tuple[int, int], list[tuple[VoucherOrderEvent, str]]] = {}
        for e in orders:
            for bucket, role in _settle_roles(e):
                by_bucket.setdefault((e.voucher_id, bucket), []).append((e, role))
        if not by_bucket:
            return {}
        pipe = self.lua.pipeline()
        for (voucher_id, bucket), group in by_bucket.items():
            self.lua.run(
                "voucher_settle",
                [*voucher_keys(voucher_id, bucket), keys.voucher_away(voucher_id, bucket)],
                [
                    versions.get(voucher_id, 0),
                    *(x for e, role in group for x in (e.id, e.user_id, e.epoch, role, e.bucket)),
                ],
                client=pipe,
            )
        return {
            slot: SettleReply(int(removed), int(late))
            for slot, (removed, late) in zip(by_bucket, pipe.execute(), strict=True)
        }

    def reconcile(self, voucher_id: int, db_stock: int, persisted: list[int], bucket: int = 0) -> ReconcileReply:
        """Make the bucket's Redis stock = its DB stock - orders pending in it, after dropping the pending orders the
        DB holds (their settle was lost). Run with the voucher row locked."""
        return ReconcileReply.parse(
            self.lua.run(
                "voucher_reconcile",
                [keys.voucher(voucher_id, bucket), keys.voucher_pending(voucher_id, bucket)],
                [db_stock, *persisted],
            )
        )

    # reads and expiry
    def stock_left(self, voucher_id: int, bucket: int = 0) -> int | None:
        """None when Redis does not hold the bucket."""
        stock = self.redis.hget(keys.voucher(voucher_id, bucket), "stock")
        return None if stock is None else int(stock)

    def per_user_limit(self, voucher_id: int) -> int | None:
        """None when Redis does not hold the voucher."""
        limit = self.redis.hget(keys.voucher(voucher_id), "limit")
        return None if limit is None else int(limit)

    def pending_count(self, voucher_id: int, bucket: int = 0) -> int:
        return self.redis.hlen(keys.voucher_pending(voucher_id, bucket))

    def pending_ids(self, voucher_id: int, bucket: int = 0) -> list[int]:
        return [int(text(order_id)) for order_id in self.redis.hkeys(keys.voucher_pending(voucher_id, bucket))]

    def pending_order(self, voucher_id: int, order_id: int, bucket: int = 0) -> VoucherOrderEvent | None:
        value = self.redis.hget(keys.voucher_pending(voucher_id, bucket), str(order_id))
        return None if value is None else _pending_order(voucher_id, order_id, value, bucket)

    def pending_orders(self, voucher_id: int, bucket: int = 0) -> list[VoucherOrderEvent]:
        """The orders whose unit was taken in this bucket and that are not yet in the DB, as the events that carry them."""
        return [
            _pending_order(voucher_id, order_id, value, bucket)
            for order_id, value in self.redis.hgetall(keys.voucher_pending(voucher_id, bucket)).items()
        ]

    def away_orders(self, voucher_id: int, bucket: int) -> list[AwayOrder]:
        """The AWAY reservations of buyers whose home is this bucket."""
        return [
            AwayOrder(int(text(order_id)), *(int(x) for x in text(value).split(";")))
            for order_id, value in self.redis.hgetall(keys.voucher_away(voucher_id, bucket)).items()
        ]

    def expire(self, voucher_id: int, ttl_s: int, bucket: int = 0) -> None:
        """Give the bucket's keys a TTL unless they have one."""
        expire_once(self.redis, [*voucher_keys(voucher_id, bucket), keys.voucher_away(voucher_id, bucket)], ttl_s)
