"""The vouchers' part of the scheduled reconciler: Redis stock + orders pending in Redis + sold in the DB =
initial stock, for every voucher on sale or ended within FINISHED_KEYS_TTL_S.

Per voucher, in this order:
- orders pending in Redis longer than age_s (their event was lost, or the writer is stuck) are persisted
  through the writer's persister (exactly once, like any delivery);
- with the voucher row locked (no writer commit meanwhile), pending orders the DB holds already leave Redis
  (their settle was lost) and the Redis stock is set to DB stock - orders pending; a voucher Redis does not
  hold is rebuilt from the DB (sales wait REBUILD_HOLD_S);
- an ended sale with nothing pending is retired (its keys get FINISHED_KEYS_TTL_S).
Vouchers are taken in id order, in pages, within the run's budget; `next_after` is where the next run continues
(0: this run reached the last one).
"""
from __future__ import annotations

from dataclasses import dataclass

from hotledger.dal.budget import Budget
from hotledger.vouchers.persist import VoucherPersister
from hotledger.vouchers.service import Vouchers
from hotledger.vouchers.store import ReconcileStatus, VoucherDb, VoucherRedis


@dataclass
class VoucherReconcileReport:
    vouchers: int = 0
    pending: int = 0
    compensated: int = 0
    corrected: int = 0
    rebuilt: int = 0
    next_after: int = 0  # the voucher id the next run continues after; 0: this run reached the last one


PAGE = 500


class VoucherReconciler:
    def __init__(self, vouchers: Vouchers, persister: VoucherPersister, db: VoucherDb, redis: VoucherRedis):
        self.vouchers, self.persister, self.db, self.redis = vouchers, persister, db, redis

    def run(self, now_ms: int, age_s: int, budget: Budget | None = None, after: int = 0,
            page: int = PAGE) -> VoucherReconcileReport:
        """Reconcile the vouchers whose keys may still be in Redis, after `after` and within `budget`; age_s: how
        long an order may stay pending before its event counts as lost."""
        budget = budget or Budget.unlimited()
        report = VoucherReconcileReport(next_after=after)
        while not budget.exhausted:
            vouchers = self.db.ending_after(now_ms - self.vouchers.finished_keys_ttl_s * 1000, report.next_after,
                                            budget.page(page))
            if not vouchers:
                report.next_after = 0
                break
            for voucher_id, end_at in vouchers:
                self._voucher(voucher_id, end_at, now_ms, age_s, report)
            budget.spend(len(vouchers))
            report.next_after = vouchers[-1][0]
        return report

    def _voucher(self, voucher_id: int, end_at: int, now_ms: int, age_s: int, report: VoucherReconcileReport) -> None:
        report.vouchers += 1
        pending = self.redis.pending_orders(voucher_id)
        report.pending += len(pending)
        stale = [e for e in pending if e.ts < now_ms - age_s * 1000]
        if stale:
            report.compensated += self.persister.persist(stale).applied
        status = self._match_stock(voucher_id)
        if status is ReconcileStatus.MISSING:
            self.vouchers.rebuild(voucher_id)
            report.rebuilt += 1
        elif status is ReconcileStatus.CORRECTED:
            report.corrected += 1
        if end_at <= now_ms and self.redis.pending_count(voucher_id) == 0:
            self.vouchers.retire(voucher_id)

    def _match_stock(self, voucher_id: int) -> ReconcileStatus:
        with self.db.transaction() as cur:
            db_stock = self.db.lock_stocks(cur, [voucher_id])[voucher_id].stock
            persisted = list(self.db.orders_by_id(cur, self.redis.pending_ids(voucher_id)))
            return self.redis.reconcile(voucher_id, db_stock, persisted).status
