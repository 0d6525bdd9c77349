"""The ledger's part of the scheduled reconciler, account by account in id order, in pages, within a budget.

- A run starts after the account id the previous run stopped at (`after`) and stops when its budget (accounts or
  time) runs out; the report's `next_after` is where the next run continues (0: the pass reached the last account).
- Per account the Redis reads are bounded: the pending count, the oldest pending charge and at most `pending_limit`
  stale ids; an account with more pending entries than that is not corrected this run (`deferred`), its oldest
  stale entries are still persisted, `pending_limit` per run.
- Entries left in an account's pending set longer than the reconcile age (the event was lost or the
  writer is stuck) are persisted from their Redis entry strings through the ledger persister (exactly once);
  an id whose entry string expired has nothing left to persist from and leaves the set.
- An ASYNC account whose cache is behind the DB (version lower, balance not equal to DB + pending, or flagged
  'dirty' by the writer after Redis lost writes) is corrected under the DB row lock by an adjusting amount (the
  drift) computed from one atomic snapshot of the cache: charges made meanwhile keep counting, so a hot account
  is corrected in one run (a compare-and-set on the version never won against ~1k charges/s).
- A SYNC account's cache is left as it is: it serves the scripts its mode alone (its balance and version are those of
  its last load and decide nothing: a SYNC account's reads and changes are the DB's; ledger.service _charge_in_db).
"""

from __future__ import annotations

from dataclasses import dataclass

from hotledger.dal.budget import Budget
from hotledger.ledger.kinds import APPLIED_KINDS
from hotledger.ledger.replies import ReconcileStatus
from hotledger.ledger.rows import AccountBalance, CacheState
from hotledger.ledger.store import LedgerStore
from hotledger.outbox.writer import Persister

PAGE = 500
PENDING_LIMIT = 10_000
SNAPSHOT_TRIES = 3


@dataclass
class AccountsReconcileReport:
    accounts: int = 0
    pending: int = 0
    oldest_pending_age_s: float = 0.0
    compensated: int = 0
    lost_entries: int = 0
    corrected: int = 0
    deferred: int = 0  # ASYNC accounts with more pending entries than the per-account limit: not corrected this run
    next_after: int = 0  # the account id the next run continues after; 0: this run reached the last account


class LedgerReconcile:
    def __init__(self, store: LedgerStore, persister: Persister, page: int = PAGE, pending_limit: int = PENDING_LIMIT):
        self.store, self.persister, self.page, self.pending_limit = store, persister, page, pending_limit

    def run(self, now_ms: int, age_s: int, budget: Budget | None = None, after: int = 0) -> AccountsReconcileReport:
        budget = budget or Budget.unlimited()
        report = AccountsReconcileReport(next_after=after)
        stale_before_ms = now_ms - age_s * 1000
        while not budget.exhausted:
            accounts = self.store.accounts_after(report.next_after, budget.page(self.page))
            if not accounts:
                report.next_after = 0  # the pass is complete: the next run starts from the first account
                break
            states = self.store.cache_states([a.user_id for a in accounts], stale_before_ms, self.pending_limit)
            for account, cache in zip(accounts, states, strict=True):
                self._account(account, cache, now_ms, report)
            budget.spend(len(accounts))
            report.next_after = accounts[-1].user_id
        return report

    def _account(
        self, account: AccountBalance, cache: CacheState, now_ms: int, report: AccountsReconcileReport
    ) -> None:
        report.accounts += 1
        report.pending += cache.pending_count
        if cache.oldest_ms is not None:
            report.oldest_pending_age_s = max(report.oldest_pending_age_s, (now_ms - cache.oldest_ms) / 1000)
        if cache.stale:
            self._compensate(account.user_id, cache.stale, report)
        if cache.balance is None or cache.version is None or account.deduct_type == "SYNC":
            return  # not cached (every script that sets a balance sets v), or a SYNC cache: its mode alone counts
        if cache.pending_count > self.pending_limit:
            report.deferred += 1
            return
        snapshot = self.store.snapshot(account.user_id, self.pending_limit)
        if snapshot is None:
            return
        entries, _ = self.store.entries(account.user_id, snapshot.ids)
        quick = account.balance + sum(
            e.delta for e in entries
        )  # may count an entry persisted meanwhile: then _correct finds it right
        if cache.dirty or cache.version < account.version or snapshot.balance != quick:
            report.corrected += self._correct(account.user_id, report)

    def _compensate(self, user_id: int, entry_ids: list[int], report: AccountsReconcileReport) -> None:
        entries, lost = self.store.entries(user_id, entry_ids)
        if lost:  # entry string expired: nothing left to persist from; drop the id so it is not counted forever
            self.store.forget_pending(user_id, lost)
            report.lost_entries += len(lost)
        if entries:
            report.compensated += self.persister.persist([e.to_event() for e in entries]).applied

    def _correct(self, user_id: int, report: AccountsReconcileReport) -> int:
        """1 when the cache was corrected; 0 when it was right already, vanished, was reloaded meanwhile, or kept
        racing a rollback (next run)."""
        for _ in range(SNAPSHOT_TRIES):
            with self.store.transaction() as tx:  # the row lock: no writer commits (nor settles new entries) meanwhile
                db_balance, db_version = tx.lock_balance(user_id)
                snapshot = self.store.snapshot(user_id, self.pending_limit)
                if snapshot is None or snapshot.mode == "SYNC":
                    return 0
                if snapshot.total > len(snapshot.ids):
                    report.deferred += 1
                    return 0
                entries, missing = self.store.entries(user_id, snapshot.ids)
                in_db = tx.stored_entries(
                    [(e.entry_id, e.kind) for e in entries] + [(i, kind) for i in missing for kind in APPLIED_KINDS]
                )
                # an id the snapshot saw, whose string is gone, that the DB lacks and that left the set since: rolled
                # back after the snapshot, so its amount is unknown here; take the snapshot again. One still in the
                # set lost its string long ago (expired): it counts for nothing, as at every cache load.
                vanished = [i for i in missing if i not in in_db]
                if vanished and set(vanished) - self.store.still_pending(user_id, vanished):
                    continue
                drift = db_balance + sum(e.delta for e in entries if e.entry_id not in in_db) - snapshot.balance
                reply = self.store.reconcile_cache(user_id, epoch=snapshot.epoch, drift=drift, db_version=db_version)
            return 1 if reply.status is ReconcileStatus.OK else 0
        return 0
