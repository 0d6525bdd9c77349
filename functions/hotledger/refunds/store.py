"""The refunds' storage: the typed wrapper of ledger_refund.lua and the SQL of t_refund."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, reply_fields


class RefundStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    SYNC = "sync"
    UNKNOWN_TOTAL = "unknown_total"
    EXCEEDS = "exceeds"
    LIMIT = "limit"


@dataclass(frozen=True)
class RefundReply:
    status: RefundStatus
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    refunded: int = 0  # the charge's refunded total after the refund (EXCEEDS: before it)
    charged: int = 0

    @property
    def missing(self) -> bool:
        return self.status is RefundStatus.MISSING

    @classmethod
    def parse(cls, raw) -> RefundReply:
        status, *rest = reply_fields(raw)
        status = RefundStatus(status)
        if status is RefundStatus.OK:
            return cls(status, int(rest[0]), int(rest[1]), rest[2], rest[3], int(rest[4]))
        if status is RefundStatus.EXCEEDS:
            return cls(status, refunded=int(rest[0]), charged=int(rest[1]))
        if status is RefundStatus.LIMIT:
            return cls(status, balance=int(rest[0]), version=int(rest[1]))
        return cls(status)


@dataclass(frozen=True)
class Refund:
    refund_id: int
    user_id: int
    charge_id: int
    charge_kind: str
    amount: int
    refunded_after: int | None  # the charge's refunded total after it (None: read from the DB, not kept there)


class RefundStore:
    def __init__(self, lua: Lua, stream_flag: str, entry_ttl_s: int, max_balance: int):
        self.lua, self.redis = lua, lua.client
        self.stream_flag, self.entry_ttl_s, self.max_balance = stream_flag, entry_ttl_s, max_balance

    def refund(self, user_id: int, refund_id: int, amount: int, ts: int, charge_id: int, charge_kind: str, charged: int,
               known_refunded: int | None, reason: str) -> RefundReply:
        return RefundReply.parse(self.lua.run(
            "ledger_refund",
            [keys.balance(user_id), keys.entry(user_id, refund_id), keys.pending(user_id), keys.refunds(user_id),
             keys.held(user_id), keys.account_stream(user_id)],
            [amount, ts, refund_id, self.entry_ttl_s, self.stream_flag, user_id, charge_id, charge_kind, charged,
             "" if known_refunded is None else known_refunded, self.max_balance, reason]))

    def refunded_in_db(self, charge_id: int) -> tuple[int, set[int]]:
        """(the charge's refunded total the DB holds, the ids of those refunds)."""
        rows = db.query("SELECT id, amount FROM t_refund WHERE charge_id = %s", (charge_id,))
        return sum(amount for _, amount in rows), {refund_id for refund_id, _ in rows}

    def stored(self, user_id: int, refund_id: int) -> Refund | None:
        rows = db.query("SELECT id, user_id, charge_id, charge_kind, amount FROM t_refund WHERE id = %s AND user_id = %s",
                        (refund_id, user_id))
        if not rows:
            return None
        refund_id, owner, charge_id, charge_kind, amount = rows[0]
        return Refund(refund_id, owner, charge_id, charge_kind, amount, None)


def refunded_in_tx(cursor, charge_id: int) -> int:
    """The charge's refunded total, in the caller's transaction (the SYNC path, under the account row lock)."""
    cursor.execute("SELECT COALESCE(SUM(amount), 0) FROM t_refund WHERE charge_id = %s", (charge_id,))
    return int(cursor.fetchone()[0])


def insert_refunds(cursor, events) -> None:
    """The writer's part for a batch's refunds (kind F, new to the DB): their t_refund rows."""
    if events:
        escape = cursor.connection.escape
        cursor.execute(
            "INSERT INTO t_refund (id, user_id, charge_id, charge_kind, amount, version, reason, create_time) VALUES "
            + ",".join("(%d,%d,%d,%s,%d,%d,%s,FROM_UNIXTIME(%d/1000))" % (
                e.id, e.user_id, e.refund_of, escape(e.refund_of_kind), e.amount, e.version, escape(e.reason or ""), e.ts)
                for e in events))
