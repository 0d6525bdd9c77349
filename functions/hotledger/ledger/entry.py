"""Shared ledger facts: entry strings in Redis, pending entries, the expected cached balance."""
from __future__ import annotations

from dataclasses import dataclass

from hotledger import keys
from hotledger.dal.redis_store import text
from hotledger.outbox.events import LedgerEvent


@dataclass(frozen=True)
class Entry:
    """A Redis entry string: amount;ts;balanceAfter;version;kind;epoch;open;idemKey (idemKey may be empty)."""

    entry_id: int
    user_id: int
    amount: int
    ts: int
    balance_after: int
    version: int
    kind: str
    epoch: str
    open: str
    idem_key: str | None = None

    @classmethod
    def parse(cls, user_id: int, entry_id: int, raw) -> Entry:
        amount, ts, balance_after, version, kind, epoch, open_, *idem_key = text(raw).split(";")
        return cls(entry_id, user_id, int(amount), int(ts), int(balance_after), int(version), kind, epoch, open_,
                   idem_key[0] if idem_key and idem_key[0] else None)

    @property
    def delta(self) -> int:
        return -self.amount if self.kind == "D" else self.amount

    def to_event(self) -> LedgerEvent:
        return LedgerEvent(
            type="ledger", id=self.entry_id, kind=self.kind, user_id=self.user_id, amount=self.amount,
            balance_after=self.balance_after, version=self.version, epoch=self.epoch, ts=self.ts,
            open=self.open, idem_key=self.idem_key,
        )


def pending_entries(client, user_id: int) -> list[Entry]:
    """Entries in the consistency set whose entry string still exists."""
    ids = [int(text(m)) for m in client.zrange(keys.consistency(user_id), 0, -1)]
    if not ids:
        return []
    raws = client.mget([keys.entry(user_id, i) for i in ids])
    return [Entry.parse(user_id, i, raw) for i, raw in zip(ids, raws) if raw is not None]


ENTRY_TABLES = (("t_order", "amount", "D"), ("t_pay", "pay", "R"))


def stored_entries(cur, ids_and_kinds: list[tuple[int, str]]) -> dict[int, tuple[int, int, int]]:
    """Entry id -> (user_id, amount, version) for those of the (id, kind) pairs the DB holds
    (t_order for deducts, t_pay for recharges)."""
    found: dict[int, tuple[int, int, int]] = {}
    for table, amount_col, kind in ENTRY_TABLES:
        ids = [entry_id for entry_id, entry_kind in ids_and_kinds if entry_kind == kind]
        if ids:
            cur.execute(f"SELECT id, user_id, {amount_col}, version FROM {table} WHERE id IN ({','.join(['%s'] * len(ids))})", ids)
            found.update((row[0], tuple(row[1:])) for row in cur.fetchall())
    return found


def expected_cache_balance(cur, client, user_id: int, db_balance: int) -> int:
    """DB balance plus every change charged in Redis that the DB does not hold yet.
    Call with the t_account row locked so no writer commits in between."""
    entries = pending_entries(client, user_id)
    in_db = stored_entries(cur, [(e.entry_id, e.kind) for e in entries])
    return db_balance + sum(e.delta for e in entries if e.entry_id not in in_db)
