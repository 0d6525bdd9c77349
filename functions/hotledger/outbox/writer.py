"""Batch writer: events -> MySQL, exactly once. It routes each event type to its feature's persister
(ledger/persist.py, vouchers, red packets), each batch of a type in one transaction, and dead-letters what
can never apply. Every persister keeps the same contract:
- it claims each event's fate key in Redis before its commit (dedupe_and_claim), so a change the API rolled
  back is skipped and a late rollback cannot undo a persisted one;
- what the DB holds already is skipped: a replay or a re-delivery changes nothing;
- what can never apply is dead-lettered with the reason, not retried;
- a transient failure (DB or Redis unavailable) raises, and the whole batch is retried.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from hotledger.dal import db
from hotledger.outbox.events import PoisonRecord
from hotledger.outbox.store import OutboxStore

REJECTED_TOPIC = "rejected-entries"


@dataclass
class PersistReport:
    applied: int = 0
    duplicates: int = 0
    rolled_back: int = 0
    dead_lettered: int = 0
    flagged_accounts: list[int] = field(default_factory=list)

    def add(self, other: PersistReport) -> None:
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.rolled_back += other.rolled_back
        self.dead_lettered += other.dead_lettered
        self.flagged_accounts += other.flagged_accounts


class Persister(Protocol):
    def persist(self, events: list) -> PersistReport:
        """Persist a batch of one event type, exactly once."""


def rejected(key: str, event_id: int, event, why: str) -> PoisonRecord:
    """An event that decoded fine but cannot apply: keyed by its id (partition -1) in the dead letters."""
    return PoisonRecord(REJECTED_TOPIC, -1, event_id, key.encode(), event.model_dump_json().encode(), why)


def dedupe_and_claim(outbox: OutboxStore, events: list, event_id, slot_of, fate_key) -> tuple[list, int, int]:
    """Drop repeated ids, then claim every event's fate key, one claim script per slot (account, voucher,
    packet). Returns (the claimed events, how many repeats, how many the API rolled back first)."""
    unique = list({event_id(e): e for e in events}.values())
    by_slot = defaultdict(list)
    for e in unique:
        by_slot[slot_of(e)].append(e)
    verdicts = outbox.claim([[fate_key(slot, e) for e in group] for slot, group in by_slot.items()])
    claimed = [e for group, marks in zip(by_slot.values(), verdicts) for e, mark in zip(group, marks) if mark]
    return claimed, len(events) - len(unique), len(unique) - len(claimed)


class Writer:
    def __init__(self, persisters: dict[type, Persister], outbox: OutboxStore):
        self.persisters, self.outbox = persisters, outbox

    def persist(self, events: list, poison: list[PoisonRecord] = ()) -> PersistReport:
        report = PersistReport()
        if poison:
            with db.transaction() as cur:
                report.dead_lettered += self.outbox.dead_letter(cur, list(poison))
        for event_type, persister in self.persisters.items():
            batch = [e for e in events if isinstance(e, event_type)]
            if batch:
                report.add(persister.persist(batch))
        return report
