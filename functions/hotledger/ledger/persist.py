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
the entries leave the pending set (ledger_settle.lua, one call per account, pipelined).

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
from contextlib import AbstractContextManager
from typing import Any

from hotledger.grants.tx import insert_grant_changes
from hotledger.holds.tx import insert_changes
from hotledger.ledger.book import book
from hotledger.ledger.entry import LedgerHead
from hotledger.ledger.kinds import HOLD_KINDS, KIND_REFUND
from hotledger.ledger.rows import AccountMove, IdempotentAnswer, LockedAccount
from hotledger.ledger.service import fingerprint
from hotledger.ledger.store import LedgerStore
from hotledger.ledger.tx import LedgerTx
from hotledger.outbox.events import LedgerEvent
from hotledger.outbox.persister import BatchPersister, Judged
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, distinct
from hotledger.refunds.tx import insert_refunds


def split_by_db(
    events: list[LedgerEvent], stored: dict[int, tuple[int, int, int]]
) -> tuple[list[LedgerEvent], list[LedgerEvent]]:
    """(not in the DB yet, same id in the DB with other content: an id clash, never silently dropped); the rest
    are in the DB already. `stored`: entry id -> (user_id, amount, version) the DB holds."""
    fresh = [e for e in events if e.id not in stored]
    clashes = [e for e in events if e.id in stored and stored[e.id] != (e.user_id, e.amount, e.version)]
    return fresh, clashes


def account_moves(
    events: list[LedgerEvent], db_versions: dict[int, int], heads: dict[int, LedgerHead]
) -> list[AccountMove]:
    """Per account: the sum of the deltas, the highest version, the open flag of the newest entry if it is
    newer than what the DB has seen (an older one must not undo a later close or reopen), and its ledger head after
    the entries (`heads`, from ledger.book)."""
    delta: dict[int, int] = defaultdict(int)
    latest: dict[int, LedgerEvent] = {}
    for e in events:
        delta[e.user_id] += e.delta
        if e.user_id not in latest or e.version > latest[e.user_id].version:
            latest[e.user_id] = e
    return [
        AccountMove(
            user_id,
            d,
            latest[user_id].version,
            latest[user_id].open if latest[user_id].version > db_versions[user_id] else None,
            heads[user_id],
        )
        for user_id, d in delta.items()
    ]


def now_ms() -> int:
    return int(time.time() * 1000)


def granted(e: LedgerEvent) -> str | None:
    """A granted recharge's grant as its Idempotency-Key's fingerprint holds it (GrantCredit.field)."""
    return None if e.grant_expires_at is None else f"{e.grant_expires_at}:{e.grant_category}"


KEY_TAKEN = "Idempotency-Key already answered by another entry"


def answer_of(e: LedgerEvent) -> dict[str, Any]:
    """The answer an ASYNC charge gave, as t_idempotency keeps it (the fields of LedgerResult)."""
    return {
        "entry_id": e.id,
        "user_id": e.user_id,
        "amount": e.amount,
        "balance": e.balance_after,
        "version": e.version,
        "mode": "ASYNC",
    }


def split_by_key(
    events: list[LedgerEvent], answers: dict[tuple[int, str], IdempotentAnswer]
) -> tuple[list[LedgerEvent], list[LedgerEvent]]:
    """(the entries to persist, the entries whose Idempotency-Key already answers another entry), in batch order:
    the first entry of a key wins in a batch; a key whose stored answer is a refusal is taken by the entry."""
    kept: list[LedgerEvent] = []
    taken: list[LedgerEvent] = []
    seen: set[tuple[int, str]] = set()
    for e in events:
        key = (e.user_id, e.idem_key or "")  # '' for an entry without a key: not looked at below
        stored = answers.get(key)
        if e.idem_key is not None and (key in seen or (stored is not None and "refused" not in stored.answer)):
            taken.append(e)
            continue
        if e.idem_key is not None:
            seen.add(key)
        kept.append(e)
    return kept, taken


class LedgerPersister(BatchPersister[LedgerEvent]):
    """The template's steps for ledger entries (outbox/persister.py); no fate claims (the module's docstring says why)."""

    def __init__(self, store: LedgerStore, outbox: OutboxStore):
        self.store, self.outbox = store, outbox

    def claim(self, events: list[LedgerEvent], report: PersistReport) -> list[LedgerEvent]:
        unique, report.duplicates = distinct(events, lambda e: e.id)
        return unique

    def transaction(self) -> AbstractContextManager[LedgerTx]:
        return self.store.transaction()

    def lock(self, tx: LedgerTx, events: list[LedgerEvent]) -> dict[int, LockedAccount]:
        return tx.lock_accounts({e.user_id for e in events})

    def rolled_back(self, tx: LedgerTx, locked: dict[int, LockedAccount], events: list[LedgerEvent]) -> set[int]:
        # the DB's rollback records, read under the row locks the API records them under
        return tx.rolled_back([e.id for e in events if e.user_id in locked])

    def judge(self, tx: LedgerTx, locked: dict[int, LockedAccount], events: list[LedgerEvent]) -> Judged[LedgerEvent]:
        orphans = [e for e in events if e.user_id not in locked]
        known = [e for e in events if e.user_id in locked]
        fresh, clashes = split_by_db(known, tx.stored_entries([(e.id, e.kind) for e in known]))
        keyed = sorted({(e.user_id, e.idem_key) for e in fresh if e.idem_key is not None})
        fresh, taken = split_by_key(fresh, tx.idempotent_answers(keyed))
        refused = {e.id for e in fresh + clashes + taken}
        return Judged(
            fresh=fresh,
            replayed=[e for e in known if e.id not in refused],
            dead=[
                (e, why)
                for group, why in (
                    (orphans, "account does not exist"),
                    (clashes, "entry id already used by another entry"),
                    (taken, KEY_TAKEN),
                )
                for e in group
            ],
        )

    def write(self, tx: LedgerTx, locked: dict[int, LockedAccount], fresh: list[LedgerEvent]) -> None:
        tx.insert_events(fresh)
        insert_changes(tx.cursor, [e for e in fresh if e.kind in HOLD_KINDS])
        insert_refunds(tx.cursor, [e for e in fresh if e.kind == KIND_REFUND])
        insert_grant_changes(tx.cursor, sorted(fresh, key=lambda e: (e.version, e.id)))
        tx.remember_answers(
            [
                (e.user_id, e.idem_key, fingerprint(e.kind, e.user_id, e.amount, granted(e)), answer_of(e))
                for e in fresh
                if e.idem_key is not None
            ]
        )
        booked, heads = book(fresh, {user_id: account.head for user_id, account in locked.items()}, now_ms())
        tx.insert_booked(booked)
        tx.move_accounts(account_moves(fresh, {user_id: account.version for user_id, account in locked.items()}, heads))

    def settle(self, locked: dict[int, LockedAccount], judged: Judged[LedgerEvent], report: PersistReport) -> None:
        """Drop the entries of existing accounts from Redis (persisted, replayed, or dead-lettered for good); the
        accounts the settle flags are the reconciler's."""
        by_user: dict[int, list[LedgerEvent]] = defaultdict(list)
        for e in [*judged.fresh, *judged.replayed, *(e for e, _ in judged.dead)]:
            if e.user_id in locked:
                by_user[e.user_id].append(e)
        report.flagged_accounts = [user_id for user_id, reply in self.store.settle(by_user).items() if reply.flagged]

    def give_back(self, e: LedgerEvent) -> None:
        self.store.rollback(e.user_id, e.id, e.idem_key)

    def settle_refused(self, e: LedgerEvent) -> None:
        # an entry the DB refuses for its data can never be persisted: taken back as the API takes one back (recorded
        # rolled back, so no later delivery persists it, and given back in Redis), so the account is not ahead of the
        # DB for good; the dead letter and WriterDeadLettered tell operators an acknowledged charge was taken back
        self.store.take_back(e.user_id, e.id, e.kind, e.idem_key)

    def id_of(self, e: LedgerEvent) -> int:
        return e.id

    def dead_letter_id(self, e: LedgerEvent) -> tuple[str, int]:
        return str(e.user_id), e.id
