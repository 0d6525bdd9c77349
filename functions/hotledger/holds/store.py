"""The holds' storage: the typed wrapper of hold_change.lua (authorize, capture, void, expire), and the SQL of t_hold (each hold as
the DB knows it) and t_hold_change (each booked change of a hold, the writer's duplicate check).

A hold's record in Redis (keys.holds): 'amount;captured;state;expiresAt;createdAt;description'."""

from __future__ import annotations

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, reply_fields
from hotledger.holds.replies import HoldReply
from hotledger.holds.rows import ACTIVE, Hold
from hotledger.holds.tx import HOLD_SELECT
from hotledger.ledger.entry import Entry

AUTHORIZE, CAPTURE, VOID, EXPIRE = "H", "C", "V", "X"


class HoldStore:
    def __init__(self, lua: Lua, stream_flag: str, entry_ttl_s: int, max_pending: int):
        self.lua, self.redis = lua, lua.client
        self.stream_flag, self.entry_ttl_s, self.max_pending = stream_flag, entry_ttl_s, max_pending

    # Redis --------------------------------------------------------------------------------------------------
    def authorize(
        self, user_id: int, hold_id: int, amount: int, ts: int, expires_at: int, description: str
    ) -> HoldReply:
        return self.change(
            AUTHORIZE, user_id, hold_id, hold_id, ts, amount, expires_at=expires_at, description=description
        )

    def change(
        self,
        op: str,
        user_id: int,
        hold_id: int,
        entry_id: int,
        ts: int,
        amount: int = 0,
        final: bool = False,
        expires_at: int = 0,
        description: str = "",
    ) -> HoldReply:
        """hold_change.lua: one change of a hold (AUTHORIZE with its expires_at and description, CAPTURE, VOID, EXPIRE)."""
        return HoldReply.parse(
            self.lua.run(
                "hold_change",
                [
                    keys.balance(user_id),
                    keys.entry(user_id, entry_id),
                    keys.pending(user_id),
                    keys.holds(user_id),
                    keys.hold_expiry(user_id),
                    keys.held(user_id),
                    keys.account_stream(user_id),
                    keys.grants(user_id),
                    keys.grant_expiry(user_id),
                ],
                [
                    op,
                    amount or "",
                    "1" if final else "",
                    ts,
                    entry_id,
                    hold_id,
                    self.entry_ttl_s,
                    self.stream_flag,
                    user_id,
                    self.max_pending,
                    expires_at,
                    description,
                ],
            )
        )

    def adopt(self, hold: Hold) -> str:
        """hold_adopt.lua: the DB's ACTIVE hold back into the cached account ('adopted', 'known' or 'missing')."""
        return str(
            reply_fields(
                self.lua.run(
                    "hold_adopt",
                    [keys.balance(hold.user_id), keys.holds(hold.user_id), keys.hold_expiry(hold.user_id)],
                    [hold.hold_id, hold.record(), hold.expires_at, hold.amount - hold.captured],
                )
            )[0]
        )

    def cached(self, user_id: int, hold_id: int) -> Hold | None:
        raw = self.redis.hget(keys.holds(user_id), str(hold_id))
        return (
            None if raw is None else Hold.of_record(user_id, hold_id, raw.decode() if isinstance(raw, bytes) else raw)
        )

    def cached_all(self, user_id: int) -> list[Hold]:
        return [
            Hold.of_record(user_id, int(field), raw.decode() if isinstance(raw, bytes) else raw)
            for field, raw in (
                (f.decode() if isinstance(f, bytes) else f, r)
                for f, r in self.redis.hgetall(keys.holds(user_id)).items()
            )
            if field.isdigit()
        ]

    def hold_of_change(self, user_id: int, entry_id: int) -> Hold | None:
        """The hold a change acted on, if the change stands (its entry string in Redis, or booked in the DB)."""
        raw = self.redis.get(keys.entry(user_id, entry_id))
        if raw is not None:
            text_ = raw.decode() if isinstance(raw, bytes) else raw
            entry = Entry.parse(user_id, entry_id, text_.removeprefix("settled;"))
            if entry.hold is not None:
                return self.cached(user_id, entry.hold.hold_id) or self.stored(user_id, entry.hold.hold_id)
        rows = db.query("SELECT hold_id FROM t_hold_change WHERE id = %s AND user_id = %s", (entry_id, user_id))
        return self.stored(user_id, rows[0][0]) if rows else None

    def due_in_db(self, before_ms: int, after_id: int, limit: int) -> list[tuple[int, int]]:
        """(user_id, hold_id) of ACTIVE holds the DB knows whose expires_at passed before before_ms, by id after
        after_id: the reconciler ends those whose delay element was lost."""
        return [
            tuple(row)
            for row in db.query(
                "SELECT user_id, id FROM t_hold WHERE state = 'ACTIVE' AND expires_at < %s AND id > %s ORDER BY id LIMIT %s",
                (before_ms, after_id, limit),
            )
        ]

    # DB -----------------------------------------------------------------------------------------------------
    def stored(self, user_id: int, hold_id: int) -> Hold | None:
        rows = db.query(HOLD_SELECT + " WHERE id = %s AND user_id = %s", (hold_id, user_id))
        return Hold(*rows[0]) if rows else None

    def stored_page(self, user_id: int, state: str | None, after_id: int, limit: int, now_ms: int) -> list[Hold]:
        """The account's holds the DB knows, newest first, below after_id (0: from the newest), in `state` as their
        readers see it at now_ms: an ACTIVE hold past its expiry is EXPIRED, tidied or not."""
        where = "WHERE user_id = %s AND id < %s"
        args: list[object] = [user_id, after_id or 2**63 - 1]
        if state == "ACTIVE":
            where += " AND state = 'ACTIVE' AND expires_at > %s"
            args.append(now_ms)
        elif state == "EXPIRED":
            where += " AND (state = 'EXPIRED' OR (state = 'ACTIVE' AND expires_at <= %s))"
            args.append(now_ms)
        elif state:
            where += " AND state = %s"
            args.append(state)
        return [Hold(*row) for row in db.query(f"{HOLD_SELECT} {where} ORDER BY id DESC LIMIT %s", (*args, limit))]


def holds_with_pending(stored: list[Hold], pending: list[Entry]) -> list[Hold]:
    """The DB's holds (holds.tx.active_holds) with the hold changes charged in Redis and not in the DB yet applied, in
    version order; the ACTIVE ones after them. This is what a cache load puts back in Redis (as
    ledger.service.expected_cache for money). An authorize keeps what the DB booked of its hold already (a change of
    it booked first)."""
    holds = {h.hold_id: h for h in stored}
    changes = sorted(((e, e.hold) for e in pending if e.hold is not None), key=lambda pair: pair[0].version)
    for e, change in changes:
        if e.kind == "H":
            booked = holds.get(change.hold_id)
            holds[change.hold_id] = Hold(
                change.hold_id,
                e.user_id,
                e.amount,
                0 if booked is None else booked.captured,
                ACTIVE if booked is None else booked.state,
                change.expires_at,
                e.ts,
                change.description or "",
            )
        elif change.hold_id in holds:
            h = holds[change.hold_id]
            holds[h.hold_id] = Hold(
                h.hold_id,
                h.user_id,
                h.amount,
                change.captured_after,
                change.state,
                h.expires_at,
                h.created_at,
                h.description,
            )
    return [h for h in holds.values() if h.state == ACTIVE]
