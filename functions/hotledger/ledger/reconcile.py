"""The ledger's part of the scheduled reconciler, account by account in id order.

- Entries left in an account's consistency set longer than the reconcile age (the event was lost or the
  writer is stuck) are persisted from their Redis entry strings through the ledger persister (exactly once);
  an id whose entry string expired has nothing left to persist from and leaves the set.
- An ASYNC account whose cache is behind the DB (version lower, balance not equal to DB + pending, or flagged
  'dirty' by the writer after Redis lost writes) is corrected under the DB row lock with a compare-and-set on
  the cached version.
- A SYNC account whose cached version is older than the DB's is evicted (the next read reloads it).
"""
from __future__ import annotations

from dataclasses import dataclass

from hotledger.ledger.service import expected_cache_balance
from hotledger.ledger.store import AccountBalance, CacheState, LedgerStore, ReconcileStatus
from hotledger.outbox.writer import Persister

PAGE = 500


@dataclass
class AccountsReconcileReport:
    accounts: int = 0
    pending: int = 0
    oldest_pending_age_s: float = 0.0
    compensated: int = 0
    lost_entries: int = 0
    corrected: int = 0
    evicted: int = 0


class LedgerReconcile:
    def __init__(self, store: LedgerStore, persister: Persister, page: int = PAGE):
        self.store, self.persister, self.page = store, persister, page

    def run(self, now_ms: int, age_s: int) -> AccountsReconcileReport:
        report = AccountsReconcileReport()
        after = 0
        while accounts := self.store.accounts_after(after, self.page):
            for account, cache in zip(accounts, self.store.cache_states([a.user_id for a in accounts])):
                self._account(account, cache, now_ms, now_ms - age_s * 1000, report)
            after = accounts[-1].user_id
        return report

    def _account(self, account: AccountBalance, cache: CacheState, now_ms: int, stale_before_ms: int,
                 report: AccountsReconcileReport) -> None:
        report.accounts += 1
        report.pending += len(cache.pending)
        if cache.pending:
            report.oldest_pending_age_s = max(report.oldest_pending_age_s, (now_ms - min(ts for _, ts in cache.pending)) / 1000)
        stale = [entry_id for entry_id, ts in cache.pending if ts < stale_before_ms]
        if stale:
            self._compensate(account.user_id, stale, report)
        if cache.balance is None:
            return
        if account.deduct_type == "SYNC":
            if cache.version < account.version:
                self.store.drop_cache(account.user_id)
                report.evicted += 1
            return
        quick = account.balance + sum(e.delta for e in self.store.pending_entries(account.user_id))
        if cache.dirty or cache.version < account.version or cache.balance != quick:
            report.corrected += self._correct(account.user_id)

    def _compensate(self, user_id: int, entry_ids: list[int], report: AccountsReconcileReport) -> None:
        entries, lost = self.store.entries(user_id, entry_ids)
        if lost:  # entry string expired: nothing left to persist from; drop the id so it is not counted forever
            self.store.forget_pending(user_id, lost)
            report.lost_entries += len(lost)
        if entries:
            report.compensated += self.persister.persist([e.to_event() for e in entries]).applied

    def _correct(self, user_id: int) -> int:
        """1 when the cache was corrected; 0 when it was right already, vanished, or moved meanwhile."""
        with self.store.transaction() as tx:
            db_balance, db_version = tx.lock_balance(user_id)
            seen = self.store.cached_version(user_id)
            if seen is None:
                return 0
            expected = expected_cache_balance(tx, self.store, user_id, db_balance)
            reply = self.store.reconcile_cache(user_id, seen_version=seen, balance=expected, db_version=db_version)
        return 1 if reply.status is ReconcileStatus.OK else 0
