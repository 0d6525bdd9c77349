"""Refunds: what runs inside a DB transaction (row locks, inserts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hotledger.ledger.entry import carried

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from hotledger.outbox.events import LedgerEvent


def refunded_in_tx(cursor: Cursor, charge_id: int) -> int:
    """The charge's refunded total, in the caller's transaction (the SYNC path, under the account row lock)."""
    cursor.execute("SELECT COALESCE(SUM(amount), 0) FROM t_refund WHERE charge_id = %s", (charge_id,))
    return int(cursor.fetchone()[0])


def insert_refunds(cursor: Cursor, events: list[LedgerEvent]) -> None:
    """The writer's part for a batch's refunds (kind F, new to the DB): their t_refund rows."""
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
