"""Refunds: what runs inside a DB transaction (row locks, inserts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pymysql

from hotledger.grants.tx import insert_grant_changes
from hotledger.ledger.entry import carried

CONSTRAINT_FAILED = 4025  # MariaDB's error for a failed CHECK: the writer's db.refused() sets the record aside

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from hotledger.outbox.events import LedgerEvent


def refunded_in_tx(cursor: Cursor, charge_id: int) -> int:
    """The charge's refunded total, in the caller's transaction (the SYNC path, under the account row lock)."""
    cursor.execute("SELECT COALESCE(SUM(amount), 0) FROM t_refund WHERE charge_id = %s", (charge_id,))
    return int(cursor.fetchone()[0])


# the refunds of a batch whose charge the books do not hold, or whose charge's refunds pass what it charged
_UNBACKED = (
    "SELECT r.id FROM t_refund r WHERE r.id IN ({ids}) AND NOT ("
    " (r.charge_kind = 'order' AND EXISTS (SELECT 1 FROM t_order o WHERE o.id = r.charge_id AND o.user_id = r.user_id"
    "   AND o.amount >= (SELECT SUM(t.amount) FROM t_refund t WHERE t.charge_id = r.charge_id)))"
    " OR (r.charge_kind = 'hold' AND EXISTS (SELECT 1 FROM t_hold h WHERE h.id = r.charge_id AND h.user_id = r.user_id"
    "   AND h.state <> 'ACTIVE' AND h.created_at <> 0"
    "   AND h.captured >= (SELECT SUM(t.amount) FROM t_refund t WHERE t.charge_id = r.charge_id))))"
)


def insert_refunds(cursor: Cursor, events: list[LedgerEvent]) -> None:
    """The writer's part for a batch's refunds (kind F, new to the DB): their t_refund rows. The books refuse a refund
    of a charge they do not hold (booked in this transaction or before: the charges' rows go in first) or one that
    takes its charge's refunds past what it charged: the batch fails as a CHECK would, and the writer dead-letters
    that record (issue 31, hole 2). The hot path refuses such refunds first (refunds/service.py); this is the floor."""
    if events:
        escape = cursor.connection.escape
        cursor.execute(
            "INSERT INTO t_refund (id, user_id, charge_id, charge_kind, amount, version, reason, create_time) VALUES "
            + ",".join(
                "(%d,%d,%d,%s,%d,%d,%s,FROM_UNIXTIME(%d/1000))"
                % (
                    e.id,
                    e.user_id,
                    carried(e.refund_of, "refund_of"),
                    escape(e.refund_of_kind),
                    e.amount,
                    e.version,
                    escape(e.reason or ""),
                    e.ts,
                )
                for e in events
            )
        )
        cursor.execute(_UNBACKED.format(ids=",".join("%d" % e.id for e in events)))
        unbacked = [row[0] for row in cursor.fetchall()]
        if unbacked:
            raise pymysql.err.IntegrityError(
                CONSTRAINT_FAILED, f"refunds {unbacked}: their charge is not booked, or they pass what it charged"
            )


def insert_refunds_and_give_backs(cursor: Cursor, events: list[LedgerEvent]) -> None:
    """A SYNC refund's rows: its t_refund row and what it gave back to its charge's grants."""
    insert_refunds(cursor, events)
    insert_grant_changes(cursor, events)
