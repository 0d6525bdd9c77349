"""Credit grants in the DB, inside a transaction the caller holds under the account row locks: the live grants of an
account, and what a batch of ledger changes does to t_grant (the writer's part and the SYNC path's: a granted recharge
makes its grant, a deduct spends, a grant expiry ends one)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hotledger.grants.rows import ACTIVE, EXPIRED, Grant, decode_spent
from hotledger.ledger.kinds import KINDS
from hotledger.outbox.events import LedgerEvent


def active_grants_read(user_id: int) -> tuple[str, tuple[int, str]]:
    """The statement (and its values) that reads the account's ACTIVE grants with something left (expired ones too,
    until their expiry entry is booked)."""
    return (
        "SELECT id, remaining, expires_at, category FROM t_grant"
        " WHERE user_id = %s AND state = %s AND remaining > 0 ORDER BY expires_at, id",
        (user_id, ACTIVE),
    )


def grants_of(user_id: int, rows: Sequence[Sequence[Any]]) -> list[Grant]:
    """active_grants_read's rows as grants."""
    return [Grant(row[0], user_id, row[1], row[2], row[3]) for row in rows]


def active_grants(cursor: Any, user_id: int) -> list[Grant]:
    """The account's ACTIVE grants with something left (active_grants_read), read with this cursor."""
    cursor.execute(*active_grants_read(user_id))
    return grants_of(user_id, cursor.fetchall())


def booked_spends(cursor: Any, grant_ids: list[int]) -> dict[int, int]:
    """What the spends the DB booked took net of each of these grants (a refund's give-back is a negative spend)."""
    if not grant_ids:
        return {}
    cursor.execute(
        "SELECT grant_id, SUM(amount) FROM t_grant_spend"
        f" WHERE grant_id IN ({','.join('%d' % g for g in grant_ids)}) GROUP BY grant_id"
    )
    return {int(grant_id): int(spent) for grant_id, spent in cursor.fetchall()}


def charge_spends_read(charge_kind: str, charge_id: int) -> tuple[str, tuple[int]]:
    """The statement (and its values) that reads what a charge spent of its account's grants, in spend order: a
    deduct's ('order') spends first-to-expire, a hold's ('hold') its captures' in the order they were made. A refund's
    give-backs (negative rows) are not spends. Each row's third column is NULL while its grant is not booked (a
    spend booked before its grant: insert_grant_changes)."""
    if charge_kind == "order":
        return (
            "SELECT s.grant_id, s.amount, g.id FROM t_grant_spend s LEFT JOIN t_grant g ON g.id = s.grant_id"
            " WHERE s.entry_id = %s AND s.amount > 0 ORDER BY g.expires_at, g.id",
            (charge_id,),
        )
    return (
        "SELECT s.grant_id, s.amount, g.id FROM t_hold_change c JOIN t_grant_spend s ON s.entry_id = c.id"
        " LEFT JOIN t_grant g ON g.id = s.grant_id WHERE c.hold_id = %s AND c.kind = 'C' AND s.amount > 0"
        " ORDER BY c.version, g.expires_at, g.id",
        (charge_id,),
    )


def live_grant_ids(cursor: Any, grant_ids: Sequence[int], now_ms: int) -> set[int]:
    """Which of these grants are live at now_ms (ACTIVE, before expires_at), spent whole or not."""
    if not grant_ids:
        return set()
    cursor.execute(
        f"SELECT id FROM t_grant WHERE id IN ({','.join(['%s'] * len(grant_ids))}) AND state = %s AND expires_at > %s",
        (*grant_ids, ACTIVE, now_ms),
    )
    return {int(row[0]) for row in cursor.fetchall()}


def insert_grant_changes(cursor: Any, changes: Sequence[LedgerEvent]) -> None:
    """t_grant after the changes, in version order: grants made first (a deduct in the same batch may spend one), then
    spends and refunds' give-backs, then expiries. A grant may be booked after its spends (after the
    broker lost its log, the reconciler persists an account's older entries, the grant's among them, after newer ones
    the new log carried): it starts from what the spends already booked left of it. A spend never takes a grant
    below 0."""
    made = [e for e in changes if KINDS[e.kind].may_grant and e.grant_expires_at is not None]
    if made:
        cursor.executemany(
            "INSERT INTO t_grant (id, user_id, amount, remaining, expires_at, category, state)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(e.id, e.user_id, e.amount, e.amount, e.grant_expires_at, e.grant_category, ACTIVE) for e in made],
        )
        # (never after its expiry: an expiry waits for the entries made before it, the grant's own among them)
        cursor.execute(
            "UPDATE t_grant g SET g.remaining = GREATEST(g.amount - COALESCE("
            "(SELECT SUM(s.amount) FROM t_grant_spend s WHERE s.grant_id = g.id), 0), 0)"
            f" WHERE g.id IN ({','.join('%d' % e.id for e in made)})"
        )
    # a refund's give-back is a negative spend: what each grant spent net stays its rows' sum
    spends = [
        (e.id, grant_id, e.user_id, amount)
        for e in changes
        if KINDS[e.kind].spends_grants
        for grant_id, amount in decode_spent(e.grants_spent)
    ] + [(e.id, grant_id, e.user_id, -amount) for e in changes for grant_id, amount in decode_spent(e.grants_refunded)]
    if spends:
        cursor.executemany(
            "INSERT INTO t_grant_spend (entry_id, grant_id, user_id, amount) VALUES (%s, %s, %s, %s)", spends
        )
        cursor.executemany(
            "UPDATE t_grant SET remaining = GREATEST(remaining - %s, 0) WHERE id = %s",
            [(amount, grant_id) for _, grant_id, _, amount in spends],
        )
    ended = [e for e in changes if KINDS[e.kind].ends_grant]
    if ended:
        now = datetime.now(UTC).replace(tzinfo=None)
        cursor.executemany(
            "INSERT INTO t_grant_expiry (id, user_id, grant_id, amount, version, create_time)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [(e.id, e.user_id, e.grant_id, e.amount, e.version, now) for e in ended],
        )
        cursor.executemany(
            "UPDATE t_grant SET remaining = 0, state = %s WHERE id = %s", [(EXPIRED, e.grant_id) for e in ended]
        )
