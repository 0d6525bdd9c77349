"""The holds' storage: the typed wrapper of hold_change.lua (authorize, capture, void, expire), and the SQL of t_hold (each hold as
the DB knows it) and t_hold_change (each booked change of a hold, the writer's duplicate check).

A hold's record in Redis (keys.holds): 'amount;captured;state;expiresAt;createdAt;description'."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, reply_fields
from hotledger.ledger.entry import Entry

ACTIVE, CAPTURED, VOIDED, EXPIRED = "ACTIVE", "CAPTURED", "VOIDED", "EXPIRED"
AUTHORIZE, CAPTURE, VOID, EXPIRE = "H", "C", "V", "X"


@dataclass(frozen=True)
class Hold:
    hold_id: int
    user_id: int
    amount: int
    captured: int
    state: str
    expires_at: int
    created_at: int
    description: str

    def record(self) -> str:
        """As keys.holds keeps it."""
        return f"{self.amount};{self.captured};{self.state};{self.expires_at};{self.created_at};{self.description}"

    @classmethod
    def of_record(cls, user_id: int, hold_id: int, raw: str) -> Hold:
        amount, captured, state, expires_at, created_at, description = raw.split(";", 5)
        return cls(hold_id, user_id, int(amount), int(captured), state, int(expires_at), int(created_at), description)


class HoldStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    SYNC = "sync"
    CLOSED = "closed"
    INSUFFICIENT = "insufficient"
    TOO_MANY_PENDING = "too_many_pending"
    NOT_FOUND = "not_found"
    ENDED = "ended"
    EXPIRED = "expired"
    NOT_DUE = "not_due"
    EXCEEDS = "exceeds"
    BUSY = "busy"


@dataclass(frozen=True)
class HoldReply:
    """hold_change.lua's answer. OK: the account after it (balance, version, epoch, open flag,
    available) and, for a change, what the entry moved and the hold after it. ENDED: the state it ended in;
    EXCEEDS: what is left to capture."""

    status: HoldStatus
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    available: int = 0
    amount: int = 0
    captured: int = 0
    state: str = ""
    released: int = 0
    expires_at: int = 0
    remaining: int = 0

    @property
    def missing(self) -> bool:
        return self.status is HoldStatus.MISSING

    @classmethod
    def parse(cls, raw) -> HoldReply:
        status, *rest = reply_fields(raw)
        status = HoldStatus(status)
        if status is HoldStatus.OK:
            balance, version, epoch, open_flag, available, *change = rest
            amount, captured, state, released, expires_at = change or ("0", "0", ACTIVE, "0", "0")
            return cls(status, int(balance), int(version), epoch, open_flag, int(available), int(amount), int(captured),
                       state, int(released), int(expires_at))
        if status in (HoldStatus.CLOSED, HoldStatus.INSUFFICIENT):
            return cls(status, balance=int(rest[0]), version=int(rest[1]))
        if status is HoldStatus.ENDED:
            return cls(status, state=rest[0])
        if status is HoldStatus.EXCEEDS:
            return cls(status, remaining=int(rest[0]))
        return cls(status)


class HoldStore:
    def __init__(self, lua: Lua, stream_flag: str, entry_ttl_s: int, max_pending: int):
        self.lua, self.redis = lua, lua.client
        self.stream_flag, self.entry_ttl_s, self.max_pending = stream_flag, entry_ttl_s, max_pending

    # Redis --------------------------------------------------------------------------------------------------
    def authorize(self, user_id: int, hold_id: int, amount: int, ts: int, expires_at: int, description: str) -> HoldReply:
        return self.change(AUTHORIZE, user_id, hold_id, hold_id, ts, amount, expires_at=expires_at,
                           description=description)

    def change(self, op: str, user_id: int, hold_id: int, entry_id: int, ts: int, amount: int = 0, final: bool = False,
               expires_at: int = 0, description: str = "") -> HoldReply:
        """hold_change.lua: one change of a hold (AUTHORIZE with its expires_at and description, CAPTURE, VOID, EXPIRE)."""
        return HoldReply.parse(self.lua.run(
            "hold_change",
            [keys.balance(user_id), keys.entry(user_id, entry_id), keys.pending(user_id), keys.holds(user_id),
             keys.hold_expiry(user_id), keys.held(user_id), keys.account_stream(user_id)],
            [op, amount or "", "1" if final else "", ts, entry_id, hold_id, self.entry_ttl_s, self.stream_flag, user_id,
             self.max_pending, expires_at, description]))

    def adopt(self, hold: Hold) -> str:
        """hold_adopt.lua: the DB's ACTIVE hold back into the cached account ('adopted', 'known' or 'missing')."""
        return reply_fields(self.lua.run(
            "hold_adopt", [keys.balance(hold.user_id), keys.holds(hold.user_id), keys.hold_expiry(hold.user_id)],
            [hold.hold_id, hold.record(), hold.expires_at, hold.amount - hold.captured]))[0]

    def cached(self, user_id: int, hold_id: int) -> Hold | None:
        raw = self.redis.hget(keys.holds(user_id), str(hold_id))
        return None if raw is None else Hold.of_record(user_id, hold_id, raw.decode() if isinstance(raw, bytes) else raw)

    def cached_all(self, user_id: int) -> list[Hold]:
        return [Hold.of_record(user_id, int(field), raw.decode() if isinstance(raw, bytes) else raw)
                for field, raw in ((f.decode() if isinstance(f, bytes) else f, r)
                                   for f, r in self.redis.hgetall(keys.holds(user_id)).items())
                if field.isdigit()]

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
        return [tuple(row) for row in db.query(
            "SELECT user_id, id FROM t_hold WHERE state = 'ACTIVE' AND expires_at < %s AND id > %s ORDER BY id LIMIT %s",
            (before_ms, after_id, limit))]

    # DB -----------------------------------------------------------------------------------------------------
    def stored(self, user_id: int, hold_id: int) -> Hold | None:
        rows = db.query(_HOLD + " WHERE id = %s AND user_id = %s", (hold_id, user_id))
        return Hold(*rows[0]) if rows else None

    def stored_page(self, user_id: int, state: str | None, after_id: int, limit: int) -> list[Hold]:
        """The account's holds the DB knows, newest first, below after_id (0: from the newest)."""
        where, args = "WHERE user_id = %s AND id < %s", [user_id, after_id or 2**63 - 1]  # type: list[object]
        if state:
            where += " AND state = %s"
            args.append(state)
        return [Hold(*row) for row in db.query(f"{_HOLD} {where} ORDER BY id DESC LIMIT %s", (*args, limit))]


_HOLD = "SELECT id, user_id, amount, captured, state, expires_at, created_at, COALESCE(description, '') FROM t_hold"


def active_holds(cursor, user_id: int) -> list[Hold]:
    """The account's ACTIVE holds as the DB holds them (in the caller's transaction, under the account row lock)."""
    cursor.execute(_HOLD + " WHERE user_id = %s AND state = 'ACTIVE'", (user_id,))
    return [Hold(*row) for row in cursor.fetchall()]


def expired_on_hold(cursor, user_id: int, now_ms: int) -> int:
    """What the account's ACTIVE holds past expires_at still keep in the DB (not tidied yet: they count for nothing)."""
    cursor.execute("SELECT COALESCE(SUM(amount - captured), 0) FROM t_hold WHERE user_id = %s AND state = 'ACTIVE'"
                   " AND expires_at <= %s", (user_id, now_ms))
    return int(cursor.fetchone()[0])


def lock_hold(cursor, user_id: int, hold_id: int) -> Hold | None:
    """The hold, its row locked until the transaction ends (the SYNC path's compare-and-set)."""
    cursor.execute(_HOLD + " WHERE id = %s AND user_id = %s FOR UPDATE", (hold_id, user_id))
    row = cursor.fetchone()
    return None if row is None else Hold(*row)


def holds_with_pending(stored: list[Hold], pending: list[Entry]) -> list[Hold]:
    """The DB's ACTIVE holds with the hold changes charged in Redis and not in the DB yet applied, in version order;
    the ACTIVE ones after them. This is what a cache load puts back in Redis (as ledger.service.expected_cache for money)."""
    holds = {h.hold_id: h for h in stored}
    changes = sorted(((e, e.hold) for e in pending if e.hold is not None), key=lambda pair: pair[0].version)
    for e, change in changes:
        if e.kind == "H":
            holds[change.hold_id] = Hold(change.hold_id, e.user_id, e.amount, 0, ACTIVE, change.expires_at, e.ts,
                                         change.description or "")
        elif change.hold_id in holds:
            h = holds[change.hold_id]
            holds[h.hold_id] = Hold(h.hold_id, h.user_id, h.amount, change.captured_after, change.state, h.expires_at,
                                    h.created_at, h.description)
    return [h for h in holds.values() if h.state == ACTIVE]


def insert_changes(cursor, events) -> None:
    """The writer's part for a batch's hold changes (kinds H, C, V, X; new to the DB): t_hold_change rows and t_hold
    brought up to date. Order-independent: an authorize sets what the hold is, a capture adds to what is captured,
    the change that ends a hold sets its final state; each change is applied once (the writer skips booked ids)."""
    if not events:
        return
    cursor.execute(
        "INSERT INTO t_hold_change (id, user_id, hold_id, kind, amount, released, version, create_time) VALUES "
        + ",".join("(%d,%d,%d,'%s',%d,%d,%d,FROM_UNIXTIME(%d/1000))" % (
            e.id, e.user_id, e.hold_id, e.kind, e.amount, e.released, e.version, e.ts) for e in events))
    escape = cursor.connection.escape
    for e in events:
        if e.kind == "H":
            cursor.execute(
                "INSERT INTO t_hold (id, user_id, amount, captured, state, expires_at, created_at, description) VALUES "
                "(%d,%d,%d,0,'ACTIVE',%d,%d,%s)" % (e.hold_id, e.user_id, e.amount, e.expires_at, e.ts,
                                                     escape(e.description or ""))
                + " ON DUPLICATE KEY UPDATE amount = VALUES(amount), expires_at = VALUES(expires_at),"
                  " created_at = VALUES(created_at), description = VALUES(description)")
        else:
            captured = e.amount if e.kind == "C" else 0
            ended = e.hold_state if e.hold_state != ACTIVE else None
            cursor.execute(
                "INSERT INTO t_hold (id, user_id, amount, captured, state, expires_at, created_at, ended_at) VALUES "
                "(%d,%d,0,%d,'%s',%d,0,%s)" % (e.hold_id, e.user_id, captured, ended or ACTIVE, e.expires_at or 0,
                                               "NULL" if ended is None else "%d" % e.ts)
                + " ON DUPLICATE KEY UPDATE captured = captured + VALUES(captured),"
                  " state = IF(VALUES(state) <> 'ACTIVE', VALUES(state), state),"
                  " ended_at = COALESCE(VALUES(ended_at), ended_at)")
