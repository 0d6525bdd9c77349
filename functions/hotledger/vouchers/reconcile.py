"""The vouchers' part of the scheduled reconciler: per stock bucket, Redis stock + orders pending in the bucket +
sold from it in the DB = its initial share, for every voucher on sale or ended within FINISHED_KEYS_TTL_S.

Per voucher, in this order:
- orders pending in any of its buckets longer than age_s (their event was lost, or the writer is stuck) are
  persisted through the writer's persister (exactly once, like any delivery);
- with the voucher row locked (no writer commit meanwhile), per bucket: pending orders the DB holds already leave
  Redis (their settle was lost) and the bucket's Redis stock is set to its DB stock - orders pending in it; a
  bucket Redis does not hold is rebuilt from the DB (sales from it wait REBUILD_HOLD_S and the log);
- away reservations older than age_s (a process died between reserving the buyer's slot at home and taking or
  giving back the unit, or the settle was lost) end: kept when the DB holds the order, given back when no bucket
  holds it pending either (read before the DB, so an order persisted meanwhile is found in the DB);
- an ended sale with nothing pending is retired (its keys get FINISHED_KEYS_TTL_S).
Vouchers are taken in id order, in pages, within the run's budget; `next_after` is where the next run continues
(0: this run reached the last one).
"""

from __future__ import annotations

from dataclasses import dataclass

from hotledger.dal.budget import Budget
from hotledger.vouchers.persist import VoucherPersister
from hotledger.vouchers.replies import ReconcileStatus
from hotledger.vouchers.service import Vouchers
from hotledger.vouchers.store import VoucherDb, VoucherRedis


@dataclass
class VoucherReconcileReport:
    vouchers: int = 0
    pending: int = 0
    compensated: int = 0
    corrected: int = 0
    rebuilt: int = 0
    away_given_back: int = 0
    next_after: int = 0  # the voucher id the next run continues after; 0: this run reached the last one


PAGE = 500


class VoucherReconciler:
    def __init__(self, vouchers: Vouchers, persister: VoucherPersister, db: VoucherDb, redis: VoucherRedis):
        self.vouchers, self.persister, self.db, self.redis = vouchers, persister, db, redis

    def run(
        self, now_ms: int, age_s: int, budget: Budget | None = None, after: int = 0, page: int = PAGE
    ) -> VoucherReconcileReport:
        """Reconcile the vouchers whose keys may still be in Redis, after `after` and within `budget`; age_s: how
        long an order may stay pending before its event counts as lost."""
        budget = budget or Budget.unlimited()
        report = VoucherReconcileReport(next_after=after)
        while not budget.exhausted:
            vouchers = self.db.ending_after(
                now_ms - self.vouchers.finished_keys_ttl_s * 1000, report.next_after, budget.page(page)
            )
            if not vouchers:
                report.next_after = 0
                break
            for voucher_id, end_at, shards in vouchers:
                self._voucher(voucher_id, end_at, shards, now_ms, age_s, report)
            budget.spend(len(vouchers))
            report.next_after = vouchers[-1][0]
        return report

    def _voucher(
        self, voucher_id: int, end_at: int, shards: int, now_ms: int, age_s: int, report: VoucherReconcileReport
    ) -> None:
        report.vouchers += 1
        buckets = range(shards)
        pending = [e for b in buckets for e in self.redis.pending_orders(voucher_id, b)]
        report.pending += len(pending)
        stale = [e for e in pending if e.ts < now_ms - age_s * 1000]
        if stale:
            report.compensated += self.persister.persist(stale).applied
        statuses = self._match_stock(voucher_id, buckets)
        if ReconcileStatus.MISSING in statuses:
            self.vouchers.rebuild(voucher_id)
            report.rebuilt += statuses.count(ReconcileStatus.MISSING)
        report.corrected += statuses.count(ReconcileStatus.CORRECTED)
        if shards > 1:
            report.away_given_back += self._end_stale_away(voucher_id, buckets, now_ms - age_s * 1000)
        if end_at <= now_ms and not any(self.redis.pending_count(voucher_id, b) for b in buckets):
            self.vouchers.retire(voucher_id, shards)

    def _match_stock(self, voucher_id: int, buckets: range) -> list[ReconcileStatus]:
        with self.db.transaction() as cur:
            self.db.lock_stocks(cur, [voucher_id])
            db_stocks = self.db.bucket_stocks(cur, voucher_id)
            statuses = []
            for bucket in buckets:
                persisted = list(self.db.orders_by_id(cur, self.redis.pending_ids(voucher_id, bucket)))
                statuses.append(self.redis.reconcile(voucher_id, db_stocks[bucket], persisted, bucket).status)
            return statuses

    def _end_stale_away(self, voucher_id: int, buckets: range, before_ms: int) -> int:
        """End the away reservations made before `before_ms`; returns how many gave the buyer's slot back."""
        stale = [(home, a) for home in buckets for a in self.redis.away_orders(voucher_id, home) if a.ts < before_ms]
        if not stale:
            return 0
        pending = {order_id for b in buckets for order_id in self.redis.pending_ids(voucher_id, b)}
        with self.db.transaction() as cur:
            self.db.lock_stocks(cur, [voucher_id])  # no writer commit between this read and the releases
            persisted = self.db.orders_by_id(cur, [a.order_id for _, a in stale])
            given_back = 0
            for home, a in stale:
                if a.order_id in persisted:
                    self.redis.release(voucher_id, home, a.order_id, a.user_id, give_back=False)
                elif a.order_id not in pending:
                    given_back += self.redis.release(voucher_id, home, a.order_id, a.user_id, give_back=True)
            return given_back
