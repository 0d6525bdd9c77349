"""The one skeleton every feature's persister follows (ledger, vouchers, red packets), with its steps left to each.

persist(events), exactly once per event however often a batch is delivered:
1. claim: drop repeated ids and, where the feature's API can roll a change back first, claim each change's fate in
   Redis (a change the API rolled back is never persisted);
2. in one DB transaction: lock what the batch touches; skip what the DB records as rolled back (read under the locks
   the API records rollbacks under, so a rollback and a commit never both win); judge each event (fresh, in the DB
   already, or never applicable, with the reason); write the fresh ones; dead-letter the rest in the same transaction;
3. after the commit: settle in Redis (the persisted changes leave the pending sets), give back in Redis what the DB
   took back or refused, then the feature's own after-commit step (a red packet grab's credit).
A batch the DB refuses for one record's data is split until that record stands alone, which is dead-lettered and
settled as refused (outbox.writer.isolating_refusals); any other failure raises and the whole batch is retried.
As Powertools' BasePersistenceLayer is one contract with small storage implementations, this is one contract with
small per-feature steps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol

from pydantic import BaseModel
from typing_extensions import TypeVar

from hotledger.dal.db import Cursor
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, persist_isolating, rejected

E = TypeVar("E", bound=BaseModel)  # the event class a persister persists
# what a feature's transaction() yields (a LedgerTx, a PacketTx, a cursor) and its lock step returns (its locked rows,
# by id); a persister names them as BatchPersister[Event, Tx, Locked], else they are left open (Any)
Tx = TypeVar("Tx", bound="HasCursor", default=Any)
Locked = TypeVar("Locked", default=Any)


class HasCursor(Protocol):
    """A transaction as cursor_of takes it by default: its cursor is where the batch's dead letters are written."""

    @property
    def cursor(self) -> Cursor: ...


@dataclass
class Judged(Generic[E]):
    """What a batch's events are, judged against the locked rows."""

    fresh: list[E] = field(default_factory=list)  # to write now
    replayed: list[E] = field(default_factory=list)  # in the DB already: nothing to write, settled again
    dead: list[tuple[E, str]] = field(default_factory=list)  # can never apply: dead-lettered with the reason
    refused: list[E] = field(default_factory=list)  # of the dead, those to give back in Redis after the commit
    late: int = 0  # of the dead, those whose unit or item the DB gave to another change first (LateChangesRefused)


class BatchPersister(ABC, Generic[E, Tx, Locked]):
    outbox: OutboxStore

    def persist(self, events: list[E]) -> PersistReport:
        return persist_isolating(
            self._persist,
            events,
            lambda e, why: rejected(*self.dead_letter_id(e), e, why),
            self.outbox,
            self.settle_refused,
        )

    def _persist(self, events: list[E]) -> PersistReport:
        report = PersistReport()
        claimed = self.claim(events, report)
        with self.transaction() as tx:
            locked = self.lock(tx, claimed)
            undone = self.rolled_back(tx, locked, claimed)
            given_back = [e for e in claimed if self.id_of(e) in undone]
            judged = self.judge(tx, locked, [e for e in claimed if self.id_of(e) not in undone])
            self.write(tx, locked, judged.fresh)
            report.dead_lettered = self.outbox.dead_letter(
                self.cursor_of(tx), [rejected(*self.dead_letter_id(e), e, why) for e, why in judged.dead]
            )
        report.rolled_back += len(given_back)
        report.applied, report.late_refused = len(judged.fresh), judged.late
        report.duplicates += len(judged.replayed)
        self.settle(locked, judged, report)
        for e in given_back + judged.refused:  # given back: rare, the API's own give-back did not run (or has not
            self.give_back(e)  # yet); both are idempotent
        self.after_commit(judged, report)
        return report

    # the steps ------------------------------------------------------------------------------------------------------
    @abstractmethod
    def claim(self, events: list[E], report: PersistReport) -> list[E]:
        """The events to persist: repeated ids dropped (counted in report.duplicates) and, with fate claims, those the
        API rolled back first dropped (counted in report.rolled_back)."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Tx]:
        """The batch's DB transaction (committed when the block ends)."""

    def cursor_of(self, tx: Tx) -> Cursor:
        """The transaction's cursor, for the dead letters written in it (a feature whose Tx has none overrides this)."""
        return tx.cursor

    @abstractmethod
    def lock(self, tx: Tx, events: list[E]) -> Locked:
        """Lock the rows the events change; returns them."""

    @abstractmethod
    def rolled_back(self, tx: Tx, locked: Locked, events: list[E]) -> set[int]:
        """The ids of those events the DB records as rolled back."""

    @abstractmethod
    def judge(self, tx: Tx, locked: Locked, events: list[E]) -> Judged[E]:
        """What each event is (Judged)."""

    @abstractmethod
    def write(self, tx: Tx, locked: Locked, fresh: list[E]) -> None:
        """Write the fresh events and what they move."""

    @abstractmethod
    def settle(self, locked: Locked, judged: Judged[E], report: PersistReport) -> None:
        """After the commit: the persisted (and replayed) changes leave Redis's pending sets."""

    @abstractmethod
    def give_back(self, event: E) -> None:
        """Give a change back in Redis that the DB took back or refused (idempotent)."""

    def settle_refused(self, event: E) -> None:
        """A record the DB refused for its data, dead-lettered alone: settled in Redis as refused (idempotent)."""
        self.give_back(event)

    def after_commit(self, judged: Judged[E], report: PersistReport) -> None:
        """The feature's own step once the batch is settled (none by default)."""

    @abstractmethod
    def id_of(self, event: E) -> int:
        """The id the DB's rollback records know the event's change by."""

    @abstractmethod
    def dead_letter_id(self, event: E) -> tuple[str, int]:
        """(key, id) of the event's dead letter."""
