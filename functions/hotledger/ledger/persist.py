"""Ledger events -> t_order / t_pay and the account balances, exactly once (the writer's ledger persister).

One transaction per batch: the touched accounts are locked, entries the DB already holds are skipped (a
replay changes nothing), the rest go in with multi-row INSERTs, and each account moves by the sum of its new
entries' deltas (order-independent, so an out-of-order batch cannot move a balance backwards) while its
version only ever rises. Under the account row locks the DB's rollback records (t_rolled_back) are read: an entry
recorded there is never persisted, whatever Redis lost and however old the event (a replay from TRIM_HORIZON), and
is given back in Redis if still pending there. The API records a rollback under the same row lock, after checking
the entry is not persisted, and only then gives the charge back in Redis (LedgerService._undo), so a rollback and a
commit never both win, and a Redis claim of the entries (as the voucher and red packet persisters take) would
decide nothing the DB does not: the writer takes none, a script call per account and batch saved. After the commit
the entries leave the consistency set (ledger_settle.lua, one call per account, pipelined).

An entry with an Idempotency-Key writes the key's answer (t_idempotency) in the same transaction, so the key is
answered from the DB once Redis forgot it (expired after a day, lost, or the account went SYNC). A key holds one
entry for good: an entry whose key already answers another entry (charged in a window where Redis had forgotten
the first) is dead-lettered, never persisted as a second charge. A key whose answer is a refusal takes the entry:
such an entry was charged, and acknowledged, before that refusal (Redis records either atomically and the API
asks the DB when Redis has no record, so the refusal came from a Redis that had lost the charge).
"""
from __future__ import annotations

import time
from collections import defaultdict

from hotledger.holds.store import insert_changes
from hotledger.ledger.book import book
from hotledger.ledger.entry import HOLD_KINDS, KIND_REFUND, LedgerHead
from hotledger.ledger.service import fingerprint
from hotledger.ledger.store import AccountMove, IdempotentAnswer, LedgerStore
from hotledger.outbox.events import LedgerEvent
from hotledger.refunds.store import insert_refunds
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, distinct, isolating_refusals, rejected


def split_by_db(events: list[LedgerEvent],
                stored: dict[int, tuple[int, int, int]]) -> tuple[list[LedgerEvent], list[LedgerEvent]]:
    """(not in the DB yet, same id in the DB with other content: an id clash, never silently dropped); the rest
    are in the DB already. `stored`: entry id -> (user_id, amount, version) the DB holds."""
    fresh = [e for e in events if e.id not in stored]
    clashes = [e for e in events if e.id in stored and stored[e.id] != (e.user_id, e.amount, e.version)]
    return fresh, clashes


def account_moves(events: list[LedgerEvent], db_versions: dict[int, int], heads: dict[int, LedgerHead]) -> list[AccountMove]:
    """Per account: the sum of the deltas, the highest version, the open flag of the newest entry if it is
    newer than what the DB has seen (an older one must not undo a later close or reopen), and its ledger head after
    the entries (`heads`, from ledger.book)."""
    delta: dict[int, int] = defaultdict(int)
    latest: dict[int, LedgerEvent] = {}
    for e in events:
        delta[e.user_id] += e.delta
        if e.user_id not in latest or e.version > latest[e.user_id].version:
            latest[e.user_id] = e
    return [AccountMove(user_id, d, latest[user_id].version,
                        latest[user_id].open if latest[user_id].version > db_versions[user_id] else None, heads[user_id])
            for user_id, d in delta.items()]


def now_ms() -> int:
    return int(time.time() * 1000)


KEY_TAKEN = "Idempotency-Key already answered by another entry"


def answer_of(e: LedgerEvent) -> dict:
    """The answer an ASYNC charge gave, as t_idempotency keeps it (the fields of LedgerResult)."""
    return {"entry_id": e.id, "user_id": e.user_id, "amount": e.amount, "balance": e.balance_after,
            "version": e.version, "mode": "ASYNC"}


def split_by_key(events: list[LedgerEvent], answers: dict[tuple[int, str], IdempotentAnswer]
                 ) -> tuple[list[LedgerEvent], list[LedgerEvent]]:
    """(the entries to persist, the entries whose Idempotency-Key already answers another entry), in batch order:
    the first entry of a key wins in a batch; a key whose stored answer is a refusal is taken by the entry."""
    kept, taken, seen = [], [], set()
    for e in events:
        key = (e.user_id, e.idem_key)
        stored = answers.get(key)
        if e.idem_key is not None and (key in seen or (stored is not None and "refused" not in stored.answer)):
            taken.append(e)
            continue
        if e.idem_key is not None:
            seen.add(key)
        kept.append(e)
    return kept, taken


class LedgerPersister:
    def __init__(self, store: LedgerStore, outbox: OutboxStore):
        self.store, self.outbox = store, outbox

    # an entry the DB refuses for its data can never be persisted: taken back as the API takes one back (recorded rolled
    # back, so no later delivery persists it, and given back in Redis), so the account is not ahead of the DB for good;
    # the dead letter and WriterDeadLettered tell operators an acknowledged charge was taken back
    @isolating_refusals(lambda e: (str(e.user_id), e.id),
                        settle_refused=lambda self, e: self.store.take_back(e.user_id, e.id, e.kind, e.idem_key))
    def persist(self, events: list[LedgerEvent]) -> PersistReport:
        report = PersistReport()
        unique, report.duplicates = distinct(events, lambda e: e.id)
        with self.store.transaction() as tx:
            locked = tx.lock_accounts({e.user_id for e in unique})
            versions = {user_id: account.version for user_id, account in locked.items()}
            orphans = [e for e in unique if e.user_id not in versions]
            known = [e for e in unique if e.user_id in versions]
            # the DB's rollback records, read under the row locks the API records them under: an entry rolled back
            # there is skipped
            undone = tx.rolled_back([e.id for e in known])
            given_back = [e for e in known if e.id in undone]
            known = [e for e in known if e.id not in undone]
            report.rolled_back = len(given_back)
            fresh, clashes = split_by_db(known, tx.stored_entries([(e.id, e.kind) for e in known]))
            report.duplicates += len(known) - len(fresh) - len(clashes)
            keyed = sorted({(e.user_id, e.idem_key) for e in fresh if e.idem_key is not None})
            fresh, taken = split_by_key(fresh, tx.idempotent_answers(keyed))
            tx.insert_events(fresh)
            insert_changes(tx.cursor, [e for e in fresh if e.kind in HOLD_KINDS])
            insert_refunds(tx.cursor, [e for e in fresh if e.kind == KIND_REFUND])
            tx.remember_answers([(e.user_id, e.idem_key, fingerprint(e.kind, e.user_id, e.amount), answer_of(e))
                                 for e in fresh if e.idem_key is not None])
            booked, heads = book(fresh, {user_id: account.head for user_id, account in locked.items()}, now_ms())
            tx.insert_booked(booked)
            tx.move_accounts(account_moves(fresh, versions, heads))
            dead = [
                rejected(str(e.user_id), e.id, e, why)
                for group, why in ((orphans, "account does not exist"), (clashes, "entry id already used by another entry"),
                                   (taken, KEY_TAKEN))
                for e in group
            ]
            report.dead_lettered = self.outbox.dead_letter(tx.cursor, dead)
        report.applied = len(fresh)
        report.flagged_accounts = self._settle(known)
        for e in given_back:  # the API gave it back already, unless its give-back failed (or has not run yet): idempotent
            self.store.rollback(e.user_id, e.id, e.idem_key)
        return report

    def _settle(self, events: list[LedgerEvent]) -> list[int]:
        """Drop persisted entries from Redis; returns accounts flagged for the reconciler."""
        by_user: dict[int, list[LedgerEvent]] = defaultdict(list)
        for e in events:
            by_user[e.user_id].append(e)
        return [user_id for user_id, reply in self.store.settle(by_user).items() if reply.flagged]
