"""Balance monitors' storage: t_balance_monitor and t_monitor_alert, and `judge`, the booking transaction's part that
fires and re-arms the monitors of the accounts it books (in seq order, under their row locks)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hotledger.dal import db
from hotledger.ledger.entry import Booked

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

BELOW, ABOVE = "below", "above"


@dataclass(frozen=True)
class Monitor:
    monitor_id: int
    user_id: int
    direction: str
    threshold: int
    rearm: int
    armed: bool


def _monitor(row: Sequence[Any]) -> Monitor:
    """A t_balance_monitor row (id, user_id, direction, threshold, rearm, armed)."""
    monitor_id, user_id, direction, threshold, rearm, armed = row
    return Monitor(monitor_id, user_id, direction, threshold, rearm, bool(armed))


@dataclass(frozen=True)
class Alert:
    monitor_id: int
    seq: int
    user_id: int
    direction: str
    threshold: int
    balance: int
    at: int


def crossed(m: Monitor, balance: int) -> bool:
    return balance < m.threshold if m.direction == BELOW else balance > m.threshold


def rearmed(m: Monitor, balance: int) -> bool:
    return balance >= m.rearm if m.direction == BELOW else balance <= m.rearm


def monitors_read(users: Sequence[int]) -> tuple[str, list[int]]:
    """The statement (and its values) that locks and reads the live monitors of the accounts (users: not empty)."""
    return (
        "SELECT id, user_id, direction, threshold, rearm, armed FROM t_balance_monitor WHERE deleted = 0 AND"
        f" user_id IN ({','.join(['%s'] * len(users))}) FOR UPDATE",
        list(users),
    )


def monitors_of(rows: Sequence[Sequence[Any]]) -> list[Monitor]:
    """monitors_read's rows as monitors."""
    return [_monitor(row) for row in rows]


def judge(cursor: Cursor, rows: list[Booked], monitors: list[Monitor] | None = None) -> list[Alert]:
    """Each monitor of the booked accounts, over the rows in seq order: an armed one that the balance crosses fires (one
    alert) and disarms; a disarmed one re-arms once the balance is back past its re-arm line. Returns the alerts.
    monitors: the accounts' monitors read (monitors_read) in this transaction already; None: read here."""
    users = sorted({r.user_id for r in rows})
    if not users:
        return []
    if monitors is None:
        cursor.execute(*monitors_read(users))
        monitors = monitors_of(cursor.fetchall())
    if not monitors:
        return []
    by_user: dict[int, list[Booked]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r.user_id, r.seq)):
        by_user[r.user_id].append(r)
    alerts, changed = [], []
    for m in monitors:
        armed = m.armed
        for r in by_user[m.user_id]:
            if armed and crossed(m, r.balance_after):
                alerts.append(
                    Alert(m.monitor_id, r.seq, m.user_id, m.direction, m.threshold, r.balance_after, r.booked_at)
                )
                armed = False
            elif not armed and rearmed(m, r.balance_after):
                armed = True
        if armed != m.armed:
            changed.append((int(armed), m.monitor_id))
    if changed:
        cursor.executemany("UPDATE t_balance_monitor SET armed = %s WHERE id = %s", changed)
    if alerts:
        cursor.executemany(
            "INSERT IGNORE INTO t_monitor_alert (monitor_id, seq, user_id, direction, threshold, balance, at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(a.monitor_id, a.seq, a.user_id, a.direction, a.threshold, a.balance, a.at) for a in alerts],
        )
    return alerts


class MonitorStore:
    def create(self, user_id: int, direction: str, threshold: int, rearm: int, now_ms: int) -> Monitor:
        """Armed unless the booked balance is past the line already (it fires on a crossing, not on a state)."""
        with db.transaction() as cur:
            cur.execute("SELECT balance FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
            (balance,) = cur.fetchone()
            probe = Monitor(0, user_id, direction, threshold, rearm, True)
            armed = not crossed(probe, balance)
            cur.execute(
                "INSERT INTO t_balance_monitor (user_id, direction, threshold, rearm, armed, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (user_id, direction, threshold, rearm, int(armed), now_ms),
            )
            return Monitor(cur.lastrowid, user_id, direction, threshold, rearm, armed)

    def monitors(self, user_id: int) -> list[Monitor]:
        return [
            _monitor(row)
            for row in db.query(
                "SELECT id, user_id, direction, threshold, rearm, armed FROM t_balance_monitor WHERE user_id = %s"
                " AND deleted = 0 ORDER BY id",
                (user_id,),
            )
        ]

    def delete(self, user_id: int, monitor_id: int) -> bool:
        return (
            db.execute(
                "UPDATE t_balance_monitor SET deleted = 1 WHERE id = %s AND user_id = %s AND deleted = 0",
                (monitor_id, user_id),
            )
            == 1
        )

    def unposted(self, limit: int) -> list[Alert]:
        return [
            Alert(*row)
            for row in db.query(
                "SELECT monitor_id, seq, user_id, direction, threshold, balance, at FROM t_monitor_alert"
                " WHERE inbox_posted = 0 ORDER BY at LIMIT %s",
                (limit,),
            )
        ]

    def posted(self, alert: Alert) -> None:
        db.execute(
            "UPDATE t_monitor_alert SET inbox_posted = 1 WHERE monitor_id = %s AND seq = %s",
            (alert.monitor_id, alert.seq),
        )

    def alerts(self, user_id: int, limit: int) -> list[Alert]:
        return [
            Alert(*row)
            for row in db.query(
                "SELECT monitor_id, seq, user_id, direction, threshold, balance, at FROM t_monitor_alert WHERE user_id = %s"
                " ORDER BY seq DESC LIMIT %s",
                (user_id, limit),
            )
        ]
