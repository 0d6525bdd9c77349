"""Voucher orders -> t_voucher_order, the voucher's DB stock moved in the same transaction, exactly once (the
writer's voucher persister, outbox/writer.py's contract).

One transaction per batch: the touched vouchers are locked in id order; an order the DB recorded as rolled back
(t_rolled_back, by the API under the same lock) is skipped and given back in Redis; an order the DB holds already is a
duplicate (skipped); one whose id or buyer slot (voucher, user, seq) the DB gives to another order can never
apply, nor can one of an unknown voucher, nor one beyond the DB stock (the DB never sells below zero: this
happens only after Redis lost state and oversold): those are dead-lettered, and after the commit settled in Redis as
refused (voucher_rollback: out of the pending hash, the unit and the buyer's slot given back, as the DB never took
them), so Redis == DB and the reconciler does not meet them again; so is an order the DB refuses on its own for its
data (outbox.writer.persist_isolating bisects it out of its batch and dead-letters it). After the commit the orders leave
Redis's pending hash (voucher_settle), handed the DB version the commit produced so an order taken before a
rebuild is counted into the rebuilt stock exactly once. Stock buckets: an order moves its voucher's stock (the judge)
and its bucket's (t_voucher_bucket); it is claimed, settled and given back in its unit's bucket, and its buyer's away
reservation, when the buyer's home is another bucket, is settled or given back there.
"""

from __future__ import annotations

from collections import Counter
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from hotledger import keys
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.outbox.persister import BatchPersister, Judged
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, dedupe_and_claim
from hotledger.vouchers.rows import OrderRow, Slot, StockRow
from hotledger.vouchers.store import VoucherDb, VoucherRedis

if TYPE_CHECKING:
    from hotledger.vouchers.store import Cursor

_Events = list[VoucherOrderEvent]

UNKNOWN_VOUCHER = "voucher does not exist"
ID_CLASH = "order id already used by another order"
SLOT_TAKEN = "the buyer's order slot is taken by another order"
SOLD_OUT_IN_DB = "sold out in the DB"


def _slot(e: VoucherOrderEvent) -> Slot:
    return e.voucher_id, e.user_id, e.seq


class VoucherPersister(BatchPersister[VoucherOrderEvent]):
    """The template's steps for voucher orders (outbox/persister.py)."""

    def __init__(self, db: VoucherDb, redis: VoucherRedis, outbox: OutboxStore):
        self.db, self.redis, self.outbox = db, redis, outbox

    def claim(self, events: list[VoucherOrderEvent], report: PersistReport) -> list[VoucherOrderEvent]:
        claimed, report.duplicates, report.rolled_back = dedupe_and_claim(
            self.outbox,
            events,
            lambda e: e.id,
            lambda e: (e.voucher_id, e.bucket),
            lambda slot, e: keys.voucher_fate(e.voucher_id, e.id, e.bucket),
        )
        return claimed

    def transaction(self) -> AbstractContextManager[Cursor]:
        return self.db.transaction()

    def cursor_of(self, tx: Cursor) -> Cursor:
        return tx  # VoucherDb's transaction is the cursor itself

    def lock(self, tx: Cursor, events: list[VoucherOrderEvent]) -> dict[int, StockRow]:
        return self.db.lock_stocks(tx, {e.voucher_id for e in events})

    def rolled_back(self, tx: Cursor, locked: dict[int, StockRow], events: list[VoucherOrderEvent]) -> set[int]:
        return self.db.rolled_back(tx, [e.id for e in events if e.voucher_id in locked])

    def judge(
        self, tx: Cursor, locked: dict[int, StockRow], events: list[VoucherOrderEvent]
    ) -> Judged[VoucherOrderEvent]:
        unknown = [e for e in events if e.voucher_id not in locked]
        known = [e for e in events if e.voucher_id in locked]
        duplicates, clashes, candidates = self._split_by_id(known, self.db.orders_by_id(tx, [e.id for e in known]))
        fresh, taken = self._split_by_slot(candidates, self.db.slot_holders(tx, [_slot(e) for e in candidates]))
        accepted, sold_out = self._within_stock(fresh, locked)
        return Judged(
            fresh=accepted,
            replayed=duplicates,
            refused=clashes + taken + sold_out,
            late=len(taken) + len(sold_out),
            dead=[
                (e, why)
                for group, why in (
                    (unknown, UNKNOWN_VOUCHER),
                    (clashes, ID_CLASH),
                    (taken, SLOT_TAKEN),
                    (sold_out, SOLD_OUT_IN_DB),
                )
                for e in group
            ],
        )

    def write(self, tx: Cursor, locked: dict[int, StockRow], fresh: list[VoucherOrderEvent]) -> None:
        self.db.insert_orders(tx, fresh)
        self.db.take_stock(tx, Counter((e.voucher_id, e.bucket) for e in fresh))

    def settle(self, locked: dict[int, StockRow], judged: Judged[VoucherOrderEvent], report: PersistReport) -> None:
        # handed the DB version the commit produced, so an order taken before a rebuild is counted into the rebuilt
        # stock exactly once
        self.redis.settle({e.voucher_id: locked[e.voucher_id].version + 1 for e in judged.fresh}, judged.fresh)
        # a re-delivered order was counted by the settle of the commit that inserted it (or, if that settle was
        # lost, by the reconciler): version 0 keeps it from being counted again
        self.redis.settle({}, judged.replayed)

    def give_back(self, e: VoucherOrderEvent) -> None:
        self.redis.rollback(e.voucher_id, e.id, e.user_id, e.bucket, e.home)

    def id_of(self, e: VoucherOrderEvent) -> int:
        return e.id

    def dead_letter_id(self, e: VoucherOrderEvent) -> tuple[str, int]:
        return f"v{e.voucher_id}", e.id

    @staticmethod
    def _split_by_id(events: _Events, stored: dict[int, OrderRow]) -> tuple[_Events, _Events, _Events]:
        """(orders the DB holds already, ids the DB gives to another order, ids not in the DB)."""
        duplicates = [e for e in events if e.id in stored and stored[e.id].slot == _slot(e)]
        clashes = [e for e in events if e.id in stored and stored[e.id].slot != _slot(e)]
        return duplicates, clashes, [e for e in events if e.id not in stored]

    @staticmethod
    def _split_by_slot(events: _Events, holders: dict[Slot, int]) -> tuple[_Events, _Events]:
        """(orders whose slot is free, orders whose slot the DB or an earlier order of the batch holds)."""
        holders = dict(holders)
        fresh: _Events = []
        taken: _Events = []
        for e in sorted(events, key=lambda e: (e.ts, e.id)):
            if _slot(e) in holders:
                taken.append(e)
            else:
                holders[_slot(e)] = e.id
                fresh.append(e)
        return fresh, taken

    @staticmethod
    def _within_stock(events: _Events, stocks: dict[int, StockRow]) -> tuple[_Events, _Events]:
        """(orders within the DB stock, orders beyond it). Redis sells only what it holds, so an order is beyond
        the DB stock only after Redis lost state and oversold."""
        left = {voucher_id: row.stock for voucher_id, row in stocks.items()}
        accepted: _Events = []
        refused: _Events = []
        for e in events:
            if left[e.voucher_id] > 0:
                left[e.voucher_id] -= 1
                accepted.append(e)
            else:
                refused.append(e)
        return accepted, refused
