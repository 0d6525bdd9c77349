"""Batch writer: events -> MySQL, exactly once. It routes each event type to its feature's persister
(ledger/persist.py, vouchers, red packets), each batch of a type in one transaction, and dead-letters what
can never apply. Every persister keeps the same contract:
- a change the API rolled back is never persisted, and a late rollback cannot undo a persisted one: the DB's
  rollback records decide, read under the row locks the API records them under; the voucher and red packet
  persisters also claim each event's fate key in Redis before their commit (dedupe_and_claim), the ledger's does
  not need to (ledger/persist.py);
- what the DB holds already is skipped: a replay or a re-delivery changes nothing;
- what can never apply is dead-lettered with the reason, not retried: what the persister judges itself (an id
  clash, an unknown account), and what the DB refuses for one record's data (a unique key such as
  uk_packet_user, a value out of range: see isolating_refusals), so one bad record never stalls a partition;
- a transient failure (DB or Redis unavailable, lock wait, deadlock) raises, and the whole batch is retried.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel
from typing_extensions import TypeVar

from hotledger.dal import db
from hotledger.outbox.events import Event, PoisonRecord
from hotledger.outbox.store import REJECTED_TOPIC, OutboxStore

log = logging.getLogger(__name__)
_E = TypeVar("_E")
_Persisted = TypeVar("_Persisted", default=Any)  # the event class a Persister persists (Persister[LedgerEvent])
_Slot = TypeVar("_Slot", bound=Hashable)


@dataclass
class PersistReport:
    applied: int = 0
    duplicates: int = 0
    rolled_back: int = 0
    dead_lettered: int = 0
    # of those dead-lettered, voucher orders and red packet claims whose unit or item the DB gave to another order or
    # grab first: only a Redis loss beyond what a rebuild's hold covers causes it (metric LateChangesRefused)
    late_refused: int = 0
    # red packet grab credits that failed after the claims' commit (refused, or the ledger down): the reconciler's
    credit_failed: int = 0
    flagged_accounts: list[int] = field(default_factory=list)

    def add(self, other: PersistReport) -> None:
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.rolled_back += other.rolled_back
        self.dead_lettered += other.dead_lettered
        self.late_refused += other.late_refused
        self.credit_failed += other.credit_failed
        self.flagged_accounts += other.flagged_accounts


class Persister(Protocol[_Persisted]):
    def persist(self, events: list[_Persisted]) -> PersistReport:
        """Persist a batch of one event type, exactly once."""


def rejected(key: str, event_id: int, event: BaseModel, why: str) -> PoisonRecord:
    """An event that decoded fine but cannot apply: keyed by its id (partition -1) in the dead letters."""
    return PoisonRecord(REJECTED_TOPIC, -1, event_id, key.encode(), event.model_dump_json().encode(), why)


def distinct(events: list[_E], event_id: Callable[[_E], int]) -> tuple[list[_E], int]:
    """(the events with repeated ids dropped, how many repeats)."""
    unique = list({event_id(e): e for e in events}.values())
    return unique, len(events) - len(unique)


def dedupe_and_claim(
    outbox: OutboxStore,
    events: list[_E],
    event_id: Callable[[_E], int],
    slot_of: Callable[[_E], _Slot],
    fate_key: Callable[[_Slot, _E], str],
) -> tuple[list[_E], int, int]:
    """Drop repeated ids, then claim every event's fate key, one claim script per slot (voucher, packet).
    Returns (the claimed events, how many repeats, how many the API rolled back first)."""
    unique, repeats = distinct(events, event_id)
    by_slot: defaultdict[_Slot, list[_E]] = defaultdict(list)
    for e in unique:
        by_slot[slot_of(e)].append(e)
    verdicts = outbox.claim([[fate_key(slot, e) for e in group] for slot, group in by_slot.items()])
    claimed = [
        e
        for group, marks in zip(by_slot.values(), verdicts, strict=True)
        for e, mark in zip(group, marks, strict=True)
        if mark
    ]
    return claimed, repeats, len(unique) - len(claimed)


def persist_isolating(
    persist: Callable[[list[_E]], PersistReport],
    events: list[_E],
    reject: Callable[[_E, str], PoisonRecord],
    outbox: OutboxStore,
    settle_refused: Callable[[_E], object],
) -> PersistReport:
    """persist(events), so that one record the DB refuses for its data (db.refused: a unique key, a NOT NULL, a CHECK,
    a value out of range) cannot fail its batch forever: the failed batch is split in halves and each half persisted on
    its own, down to the records the DB refuses alone; each of those is dead-lettered once with the DB's reason
    (reject(event, why): the persister's own dead letter), then settle_refused(event) settles it in Redis as refused
    (idempotent: a re-delivery settles it again, changing nothing), as the persister settles the records it refuses
    itself, so Redis == DB. The rest is applied exactly once: every half is its own transaction and persisting is
    idempotent, so a re-delivery of the batch changes nothing.
    Any other failure raises and the whole batch is retried: a transient one (DB or Redis unavailable, lock wait,
    deadlock) or a fault in the code, which must not set good records aside.
    Precedents: AWS Lambda's BisectBatchOnFunctionError for Kafka/Kinesis sources (split the failing batch,
    isolate the record), Kafka Connect's errors.tolerance with a dead letter queue (per-record, with the reason
    in the headers); unlike Lambda's, only a refusal of the data bisects."""
    try:
        return persist(events)
    except Exception as exc:
        why = db.refused(exc)
        if why is None:
            raise
    if len(events) == 1:
        log.error("record refused by the DB, dead-lettered: %s", why)
        report = PersistReport(dead_lettered=outbox.dead_letter_alone([reject(events[0], why)]))
        settle_refused(events[0])
        return report
    half = len(events) // 2
    report = persist_isolating(persist, events[:half], reject, outbox, settle_refused)
    report.add(persist_isolating(persist, events[half:], reject, outbox, settle_refused))
    return report


class Writer:
    def __init__(self, persisters: dict[type, Persister[Any]], outbox: OutboxStore):
        """`persisters`: event class -> the persister of its events (each persists its own class only)."""
        self.persisters, self.outbox = persisters, outbox

    def persist(
        self,
        events: Sequence[Event],
        poison: Sequence[PoisonRecord] = (),
        applied: dict[tuple[str, int], int] | None = None,
    ) -> PersistReport:
        """`applied`: (topic, partition) -> the batch's last offset, recorded as the log watermark once every
        persister committed (after them, not within: the watermark can only lag what is applied, never lead it;
        a crash in between re-delivers the batch, which records it then)."""
        report = PersistReport()
        if poison:
            report.dead_lettered += self.outbox.dead_letter_alone(list(poison))
        for event_type, persister in self.persisters.items():
            batch = [e for e in events if isinstance(e, event_type)]
            if batch:
                report.add(persister.persist(batch))
        if applied:
            self.outbox.record_applied(applied)
        return report
