"""Holds: what runs inside a DB transaction (row locks, inserts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hotledger.grants.tx import insert_grant_changes
from hotledger.holds.rows import ACTIVE, Hold
from hotledger.ledger.entry import carried

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from hotledger.outbox.events import LedgerEvent

HOLD_SELECT = (
    "SELECT id, user_id, amount, captured, state, expires_at, created_at, COALESCE(description, '') FROM t_hold"
)


def active_holds(cursor: Cursor, user_id: int) -> list[Hold]:
    """The account's ACTIVE holds as the DB holds them (in the caller's transaction, under the account row lock), and
    in any state those it booked a change of before their authorize (created_at 0: after the broker lost its log, the
    reconciler books the authorize later): a cache load applies their pending authorize to what the DB booked."""
    cursor.execute(HOLD_SELECT + " WHERE user_id = %s AND (state = 'ACTIVE' OR created_at = 0)", (user_id,))
    return [Hold(*row) for row in cursor.fetchall()]


def expired_on_hold_read(user_id: int, now_ms: int) -> tuple[str, tuple[int, int]]:
    """The statement (and its values) of expired_on_hold: its one row holds the sum."""
    return (
        "SELECT COALESCE(SUM(amount - captured), 0) FROM t_hold WHERE user_id = %s AND state = 'ACTIVE'"
        " AND expires_at <= %s",
        (user_id, now_ms),
    )


def expired_on_hold(cursor: Cursor, user_id: int, now_ms: int) -> int:
    """What the account's ACTIVE holds past expires_at still keep in the DB (not tidied yet: they count for nothing)."""
    cursor.execute(*expired_on_hold_read(user_id, now_ms))
    return int(cursor.fetchone()[0])


def lock_hold(cursor: Cursor, user_id: int, hold_id: int) -> Hold | None:
    """The hold, its row locked until the transaction ends (the SYNC path's compare-and-set)."""
    cursor.execute(HOLD_SELECT + " WHERE id = %s AND user_id = %s FOR UPDATE", (hold_id, user_id))
    row = cursor.fetchone()
    return None if row is None else Hold(*row)


def insert_changes(cursor: Cursor, events: list[LedgerEvent]) -> None:
    """The writer's part for a batch's hold changes (kinds H, C, V, X; new to the DB): t_hold_change rows and t_hold
    brought up to date. Order-independent: an authorize sets what the hold is, a capture adds to what is captured,
    the change that ends a hold sets its final state; each change is applied once (the writer skips booked ids)."""
    if not events:
        return
    cursor.execute(
        "INSERT INTO t_hold_change (id, user_id, hold_id, kind, amount, released, version, create_time) VALUES "
        + ",".join(
            "(%d,%d,%d,'%s',%d,%d,%d,FROM_UNIXTIME(%d/1000))"
            % (e.id, e.user_id, carried(e.hold_id, "hold_id"), e.kind, e.amount, e.released, e.version, e.ts)
            for e in events
        )
    )
    escape = cursor.connection.escape
    for e in events:
        if e.kind == "H":
            cursor.execute(
                "INSERT INTO t_hold (id, user_id, amount, captured, state, expires_at, created_at, description) VALUES "
                "(%d,%d,%d,0,'ACTIVE',%d,%d,%s)"
                % (
                    carried(e.hold_id, "hold_id"),
                    e.user_id,
                    e.amount,
                    carried(e.expires_at, "expires_at"),
                    e.ts,
                    escape(e.description or ""),
                )
                + " ON DUPLICATE KEY UPDATE amount = VALUES(amount), expires_at = VALUES(expires_at),"
                " created_at = VALUES(created_at), description = VALUES(description)"
            )
        else:
            captured = e.amount if e.kind == "C" else 0
            ended = e.hold_state if e.hold_state != ACTIVE else None
            cursor.execute(
                "INSERT INTO t_hold (id, user_id, amount, captured, state, expires_at, created_at, ended_at) VALUES "
                "(%d,%d,0,%d,'%s',%d,0,%s)"
                % (
                    carried(e.hold_id, "hold_id"),
                    e.user_id,
                    captured,
                    ended or ACTIVE,
                    e.expires_at or 0,
                    "NULL" if ended is None else "%d" % e.ts,
                )
                + " ON DUPLICATE KEY UPDATE captured = captured + VALUES(captured),"
                " state = IF(VALUES(state) <> 'ACTIVE', VALUES(state), state),"
                " ended_at = COALESCE(VALUES(ended_at), ended_at)"
            )


def insert_changes_and_spends(cursor: Cursor, events: list[LedgerEvent]) -> None:
    """A SYNC hold change's rows: its t_hold_change and t_hold, and what a capture spent of the account's grants."""
    insert_changes(cursor, events)
    insert_grant_changes(cursor, events)
