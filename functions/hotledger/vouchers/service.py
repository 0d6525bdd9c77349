"""Flash sales (seckill vouchers).

A voucher lives in the DB (t_seckill_voucher) and is preloaded to Redis. An order is one Lua script
(time window, stock, per-user limit, decrement, buyer record, pending order), made durable by the
configured transport before the answer. The writer inserts t_voucher_order rows and moves the DB stock
in one transaction per batch; the reconciler keeps Redis stock + pending + sold in the DB = initial stock
and rebuilds a voucher Redis lost from the DB.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal import db
from hotledger.dal.redis_store import expire_once, text
from hotledger.outbox.durable import Durability, Outbound
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, dedupe_and_claim, rejected
from hotledger.vouchers.store import (
    OrderReply,
    OrderStatus,
    VoucherScripts,
    voucher_keys,
)


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


class Seckill:
    def __init__(self, cfg: Settings, scripts, ids, publish):
        self.cfg, self.scripts, self.redis, self.ids = cfg, scripts, scripts.client, ids
        self.durability = Durability(cfg, publish, ids.next_id)
        self.lua = VoucherScripts(scripts, self.durability.stream_flag, cfg.entry_ttl_s)

    def create_voucher(self, title: str, stock: int, begin_at: int, end_at: int, per_user_limit: int) -> int:
        with db.transaction() as cur:
            cur.execute("INSERT INTO t_seckill_voucher (title, initial_stock, stock, per_user_limit, begin_time, end_time)"
                        " VALUES (%s, %s, %s, %s, %s, %s)", (title, stock, stock, per_user_limit, db.to_datetime(begin_at), db.to_datetime(end_at)))
            voucher_id = cur.lastrowid
        self.load(voucher_id, hold_until=0)
        return voucher_id

    def load(self, voucher_id: int, hold_until: int) -> None:
        """Put the voucher into Redis from the DB (no-op when Redis holds it). The row lock keeps writer commits
        out while the stock, version and buyers are read together."""
        with db.transaction() as cur:
            cur.execute("SELECT stock, begin_time, end_time, per_user_limit, version FROM t_seckill_voucher WHERE id = %s"
                        " FOR UPDATE", (voucher_id,))
            row = cur.fetchone()
            if row is None:
                raise errors.VoucherNotFound(f"voucher {voucher_id} does not exist")
            stock, begin, end, limit, version = row
            cur.execute("SELECT user_id, COUNT(*) FROM t_voucher_order WHERE voucher_id = %s GROUP BY user_id", (voucher_id,))
            buyers = [x for pair in cur.fetchall() for x in pair]
            self.scripts.voucher_load(keys=voucher_keys(voucher_id)[:2], args=[
                stock, db.to_ms(begin), db.to_ms(end), limit, str(self.ids.next_id()), hold_until, version, *buyers])
        if db.to_ms(end) <= time.time() * 1000:
            self.retire(voucher_id)

    def retire(self, voucher_id: int) -> None:
        """An ended sale's keys leave Redis after FINISHED_KEYS_TTL_S (a late request reloads them, then ENDED)."""
        expire_once(self.redis, voucher_keys(voucher_id), self.cfg.finished_keys_ttl_s)

    def rebuild(self, voucher_id: int) -> None:
        """Redis lost the voucher: orders acknowledged before the loss may still be on their way to the DB,
        so sales wait REBUILD_HOLD_S; the writer counts any such order into the rebuilt stock when it lands."""
        self.load(voucher_id, hold_until=int(time.time() * 1000) + self.cfg.rebuild_hold_s * 1000)

    def get_voucher(self, voucher_id: int) -> Voucher:
        rows = db.query("SELECT title, initial_stock, stock, per_user_limit, begin_time, end_time FROM t_seckill_voucher"
                        " WHERE id = %s", (voucher_id,))
        if not rows:
            raise errors.VoucherNotFound(f"voucher {voucher_id} does not exist")
        title, initial, db_stock, limit, begin, end = rows[0]
        stock_left = self.redis.hget(keys.voucher(voucher_id), "stock")
        if stock_left is None:
            self.rebuild(voucher_id)
            stock_left = self.redis.hget(keys.voucher(voucher_id), "stock")
        pending = self.redis.hlen(keys.voucher_pending(voucher_id))
        return Voucher(voucher_id, title, initial, int(stock_left), initial - db_stock, pending, limit, db.to_ms(begin), db.to_ms(end))

    def order(self, voucher_id: int, user_id: int) -> VoucherOrder:
        now = int(time.time() * 1000)

        def outbound(order_id: int, reply: OrderReply) -> Outbound:
            event = VoucherOrderEvent(type="voucher_order", id=order_id, voucher_id=voucher_id, user_id=user_id,
                                      seq=reply.seq, ts=now, epoch=reply.epoch)
            return Outbound(f"v{voucher_id}", event.model_dump, lambda: self.lua.rollback(voucher_id, order_id, user_id))

        order_id, reply = self.durability.apply(
            lambda order_id: self.lua.order(voucher_id, user_id, order_id, now), reload=lambda: self.rebuild(voucher_id),
            refusal=_refusal, outbound=outbound, unknown=lambda order_id, why: _order_unknown(voucher_id, order_id, why),
            what=f"order of voucher {voucher_id}")
        return VoucherOrder(order_id, voucher_id, user_id, reply.seq)

    def get_order(self, voucher_id: int, order_id: int) -> VoucherOrder:
        # the writer deletes the pending record only after its DB commit: missing here means in the DB or never taken
        pending = self.redis.hget(keys.voucher_pending(voucher_id), str(order_id))
        if pending is not None:
            user_id, seq, _, _ = text(pending).split(";")
            return VoucherOrder(order_id, voucher_id, int(user_id), int(seq))
        rows = db.query("SELECT user_id, seq FROM t_voucher_order WHERE id = %s AND voucher_id = %s", (order_id, voucher_id))
        if rows:
            return VoucherOrder(order_id, voucher_id, rows[0][0], rows[0][1], "PERSISTED")
        raise errors.OrderNotFound(f"order {order_id} of voucher {voucher_id} does not exist")

    def pending_orders(self, voucher_id: int) -> list[VoucherOrderEvent]:
        raw = self.redis.hgetall(keys.voucher_pending(voucher_id))
        events = []
        for order_id, value in raw.items():
            user_id, seq, ts, epoch = text(value).split(";")
            events.append(VoucherOrderEvent(type="voucher_order", id=int(order_id), voucher_id=voucher_id,
                                            user_id=int(user_id), seq=int(seq), ts=int(ts), epoch=epoch))
        return events


class SeckillPersister:
    """Writer side: voucher orders -> t_voucher_order, stock moved in the same transaction, exactly once."""

    def __init__(self, scripts, outbox: OutboxStore):
        self.scripts, self.outbox = scripts, outbox

    def persist(self, events: list[VoucherOrderEvent]) -> PersistReport:
        report = PersistReport()
        claimed, report.duplicates, report.rolled_back = dedupe_and_claim(
            self.outbox, events, lambda e: e.id, lambda e: e.voucher_id, lambda v, e: keys.voucher_fate(v, e.id))
        with db.transaction() as cur:
            vouchers = self._lock_vouchers(cur, {e.voucher_id for e in claimed})
            known = [e for e in claimed if e.voucher_id in vouchers]
            dead = [rejected(f"v{e.voucher_id}", e.id, e, "voucher does not exist") for e in claimed if e.voucher_id not in vouchers]
            fresh, duplicates, clashes = self._split_by_db(cur, known)
            report.duplicates += len(duplicates)
            dead += [rejected(f"v{e.voucher_id}", e.id, e, why) for e, why in clashes]
            accepted, sold_out = self._within_stock(fresh, vouchers)
            dead += [rejected(f"v{e.voucher_id}", e.id, e, "sold out in the DB") for e in sold_out]
            versions = self._insert(cur, accepted, vouchers)
            report.dead_lettered = self.outbox.dead_letter(cur, dead)
        report.applied = len(accepted)
        self._settle(accepted, versions)
        # a re-delivered order was counted by the settle of the commit that inserted it (or, if that settle was
        # lost, by the reconciler): version 0 keeps it from being counted again
        self._settle(duplicates, {})
        return report

    @staticmethod
    def _lock_vouchers(cur, voucher_ids: set[int]) -> dict[int, list[int]]:
        """voucher id -> [stock, version], rows locked in id order."""
        if not voucher_ids:
            return {}
        ordered = sorted(voucher_ids)
        cur.execute(f"SELECT id, stock, version FROM t_seckill_voucher WHERE id IN ({','.join(['%s'] * len(ordered))})"
                    " ORDER BY id FOR UPDATE", ordered)
        return {row[0]: [row[1], row[2]] for row in cur.fetchall()}

    @staticmethod
    def _split_by_db(cur, events: list[VoucherOrderEvent]):
        """(new orders, orders the DB holds already, (order, why) that can never apply)."""
        if not events:
            return [], [], []
        cur.execute(f"SELECT id, voucher_id, user_id, seq FROM t_voucher_order WHERE id IN ({','.join(['%s'] * len(events))})",
                    [e.id for e in events])
        present = {row[0]: tuple(row[1:]) for row in cur.fetchall()}
        duplicates = [e for e in events if present.get(e.id) == (e.voucher_id, e.user_id, e.seq)]
        clashes = [(e, "order id already used by another order") for e in events
                   if e.id in present and present[e.id] != (e.voucher_id, e.user_id, e.seq)]
        candidates = [e for e in events if e.id not in present]
        slots: dict[tuple, int] = {}
        if candidates:
            cur.execute("SELECT voucher_id, user_id, seq, id FROM t_voucher_order WHERE (voucher_id, user_id, seq) IN ("
                        + ",".join(["(%s,%s,%s)"] * len(candidates)) + ")",
                        [x for e in candidates for x in (e.voucher_id, e.user_id, e.seq)])
            slots = {tuple(row[:3]): row[3] for row in cur.fetchall()}
        fresh = []
        for e in sorted(candidates, key=lambda e: (e.ts, e.id)):
            slot = (e.voucher_id, e.user_id, e.seq)
            if slot in slots:
                clashes.append((e, "the buyer's order slot is taken by another order"))
            else:
                slots[slot] = e.id
                fresh.append(e)
        return fresh, duplicates, clashes

    @staticmethod
    def _within_stock(events: list[VoucherOrderEvent], vouchers: dict[int, list[int]]):
        """The DB never sells below zero: orders beyond the DB stock are refused (dead-lettered, alarmed).
        Redis sells only what it holds, so this happens only after Redis lost state and oversold."""
        left = {v: stock for v, (stock, _) in vouchers.items()}
        accepted, refused = [], []
        for e in events:
            if left[e.voucher_id] > 0:
                left[e.voucher_id] -= 1
                accepted.append(e)
            else:
                refused.append(e)
        return accepted, refused

    @staticmethod
    def _insert(cur, events: list[VoucherOrderEvent], vouchers: dict[int, list[int]]) -> dict[int, int]:
        """Insert the orders and move each voucher's stock; returns voucher id -> DB version after this commit."""
        if events:
            cur.execute("INSERT INTO t_voucher_order (id, voucher_id, user_id, seq, create_time) VALUES "
                        + ",".join("(%d,%d,%d,%d,FROM_UNIXTIME(%d/1000))" % (e.id, e.voucher_id, e.user_id, e.seq, e.ts)
                                   for e in events))
        sold = defaultdict(int)
        for e in events:
            sold[e.voucher_id] += 1
        for voucher_id, n in sold.items():
            cur.execute("UPDATE t_seckill_voucher SET stock = stock - %s, version = version + 1 WHERE id = %s", (n, voucher_id))
            vouchers[voucher_id][1] += 1
        return {v: version for v, (_, version) in vouchers.items()}

    def _settle(self, events: list[VoucherOrderEvent], versions: dict[int, int]) -> None:
        by_voucher = defaultdict(list)
        for e in events:
            by_voucher[e.voucher_id].append(e)
        if not by_voucher:
            return
        pipe = self.scripts.client.pipeline(transaction=False)
        for voucher_id, group in by_voucher.items():
            self.scripts.voucher_settle(keys=voucher_keys(voucher_id), client=pipe,
                                        args=[versions.get(voucher_id, 0), *(x for e in group for x in (e.id, e.user_id, e.epoch))])
        pipe.execute()


@dataclass
class VoucherReconcileReport:
    vouchers: int = 0
    pending: int = 0
    compensated: int = 0
    corrected: int = 0
    rebuilt: int = 0


def reconcile_vouchers(seckill: Seckill, persister: SeckillPersister, now_ms: int, age_s: int) -> VoucherReconcileReport:
    """For every voucher on sale or ended within FINISHED_KEYS_TTL_S: persist orders pending longer than age_s
    (their event was lost), then make Redis stock = DB stock - orders pending in Redis, rebuilding a voucher
    Redis lost; an ended one with nothing pending is retired."""
    report = VoucherReconcileReport()
    rows = db.query("SELECT id, end_time FROM t_seckill_voucher WHERE end_time > %s ORDER BY id",
                    (db.to_datetime(now_ms - seckill.cfg.finished_keys_ttl_s * 1000),))
    for voucher_id, end_time in rows:
        report.vouchers += 1
        pending = seckill.pending_orders(voucher_id)
        report.pending += len(pending)
        stale = [e for e in pending if e.ts < now_ms - age_s * 1000]
        if stale:
            report.compensated += persister.persist(stale).applied
        with db.transaction() as cur:
            cur.execute("SELECT stock FROM t_seckill_voucher WHERE id = %s FOR UPDATE", (voucher_id,))
            (db_stock,) = cur.fetchone()
            pending_ids = [int(text(i)) for i in seckill.redis.hkeys(keys.voucher_pending(voucher_id))]
            persisted = []
            if pending_ids:
                cur.execute(f"SELECT id FROM t_voucher_order WHERE id IN ({','.join(['%s'] * len(pending_ids))})", pending_ids)
                persisted = [row[0] for row in cur.fetchall()]
            reply = seckill.scripts.voucher_reconcile(keys=[keys.voucher(voucher_id), keys.voucher_pending(voucher_id)],
                                                      args=[db_stock, *persisted])
        status = text(reply[0])
        if status == "missing":
            seckill.rebuild(voucher_id)
            report.rebuilt += 1
        elif status == "corrected":
            report.corrected += 1
        if db.to_ms(end_time) <= now_ms and not seckill.redis.exists(keys.voucher_pending(voucher_id)):
            seckill.retire(voucher_id)
    return report
