"""Reconciler, run on a schedule.

- Entries left in an account's consistency set longer than RECONCILE_AGE_S (the event was lost or the
  writer is stuck) are persisted from their Redis entry strings through the same exactly-once writer.
- An ASYNC account whose cache is behind the DB (version lower, balance not equal to DB + pending,
  or flagged by the writer after Redis lost writes) is corrected under the DB row lock with a
  compare-and-set on the cached version.
- A SYNC account whose cached version is older than the DB's is evicted.
It reports the number of pending entries and the oldest pending age. Vouchers and red packets are
reconciled by vouchers/reconcile.py and logic/redpackets.py; unfinished journeys become inbox reminders
(logic/journeys.py); order-close reminders Redis lost are offered again and orders past their close time
closed (logic/orders.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import text
from hotledger.ledger.entry import Entry, expected_cache_balance, pending_entries
from hotledger.notices.journeys import JourneyScanReport
from hotledger.outbox.writer import Writer
from hotledger.redpackets.reconcile import PacketReconcileReport
from hotledger.vouchers.reconcile import VoucherReconciler, VoucherReconcileReport

PAGE = 500


@dataclass
class ReconcileReport:
    accounts: int = 0
    pending: int = 0
    oldest_pending_age_s: float = 0.0
    compensated: int = 0
    lost_entries: int = 0
    corrected: int = 0
    evicted: int = 0
    vouchers: VoucherReconcileReport = field(default_factory=VoucherReconcileReport)
    packets: PacketReconcileReport = field(default_factory=PacketReconcileReport)
    journeys: JourneyScanReport = field(default_factory=JourneyScanReport)
    reminders_reoffered: int = 0
    orders_closed: int = 0


class Reconciler:
    def __init__(self, scripts, writer: Writer, age_s: int, vouchers: VoucherReconciler, redpackets, journeys, payment_orders):
        self.scripts, self.redis, self.writer, self.age_s = scripts, scripts.client, writer, age_s
        self.vouchers, self.redpackets, self.journeys, self.payment_orders = vouchers, redpackets, journeys, payment_orders

    def run(self, now_ms: int) -> ReconcileReport:
        report = self._accounts(now_ms)
        report.vouchers = self.vouchers.run(now_ms, self.age_s)
        report.packets = self.redpackets.run(now_ms, self.age_s)
        report.journeys = self.journeys.scan(now_ms)
        report.reminders_reoffered = self.payment_orders.reoffer_lost_reminders(now_ms)
        report.orders_closed = self.payment_orders.close_overdue(now_ms)
        return report

    def _accounts(self, now_ms: int) -> ReconcileReport:
        report = ReconcileReport()
        after = 0
        while True:
            rows = db.query(
                "SELECT u.id, u.deduct_type, a.balance, a.version FROM t_user u JOIN t_account a ON a.user_id = u.id"
                " WHERE u.id > %s ORDER BY u.id LIMIT %s",
                (after, PAGE),
            )
            if not rows:
                return report
            self._page(rows, now_ms, report)
            after = rows[-1][0]

    def _page(self, rows, now_ms: int, report: ReconcileReport) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for user_id, *_ in rows:
            pipe.hmget(keys.balance(user_id), "balance", "v", "dirty")
            pipe.zrange(keys.consistency(user_id), 0, -1, withscores=True)
        replies = pipe.execute()
        cutoff = now_ms - self.age_s * 1000
        for (user_id, deduct_type, db_balance, db_version), cached, pending in zip(rows, replies[0::2], replies[1::2]):
            report.accounts += 1
            report.pending += len(pending)
            if pending:
                report.oldest_pending_age_s = max(report.oldest_pending_age_s, (now_ms - min(s for _, s in pending)) / 1000)
            stale = [int(text(m)) for m, score in pending if score < cutoff]
            if stale:
                self._compensate(user_id, stale, report)
            balance, version, dirty = cached
            if balance is None:
                continue
            if deduct_type == "SYNC":
                if int(version) < db_version:
                    self.redis.delete(keys.balance(user_id))
                    report.evicted += 1
                continue
            quick = db_balance + sum(e.delta for e in pending_entries(self.redis, user_id))
            if dirty is not None or int(version) < db_version or int(balance) != quick:
                report.corrected += self._correct(user_id)

    def _compensate(self, user_id: int, entry_ids: list[int], report: ReconcileReport) -> None:
        raws = self.redis.mget([keys.entry(user_id, i) for i in entry_ids])
        entries = [Entry.parse(user_id, i, raw) for i, raw in zip(entry_ids, raws) if raw is not None]
        lost = [i for i, raw in zip(entry_ids, raws) if raw is None]
        if lost:  # entry string expired: nothing left to persist from; drop the id so it is not counted forever
            self.redis.zrem(keys.consistency(user_id), *lost)
            report.lost_entries += len(lost)
        if entries:
            report.compensated += self.writer.persist([e.to_event() for e in entries]).applied

    def _correct(self, user_id: int) -> int:
        with db.transaction() as cur:
            cur.execute("SELECT balance, version FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
            db_balance, db_version = cur.fetchone()
            version = self.redis.hget(keys.balance(user_id), "v")
            if version is None:
                return 0
            expected = expected_cache_balance(cur, self.redis, user_id, db_balance)
            reply = self.scripts.ledger_reconcile(keys=[keys.balance(user_id)], args=[text(version), expected, db_version])
        return 1 if text(reply[0]) == "ok" else 0
