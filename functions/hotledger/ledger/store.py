"""The ledger's storage: typed wrappers of the ledger_*.lua scripts (keys tagged {uid}: one slot per account).
SQL of t_user / t_account / t_order / t_pay / t_idempotency joins here as the feature moves in."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal.redis_store import Lua, reply_fields


class ApplyStatus(Enum):
    OK = "ok"
    REPLAY = "replay"
    MISSING = "missing"
    SYNC = "sync"
    CLOSED = "closed"
    INSUFFICIENT = "insufficient"
    LIMIT = "limit"
    CONFLICT = "conflict"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class ApplyReply:
    """ledger_apply.lua's answer. OK: the new entry's balance after, version, cache epoch and open flag.
    REPLAY: the first answer for the Idempotency-Key (entry_id, balance, version) and whether its event is
    known durable (`done`). CLOSED / INSUFFICIENT / LIMIT carry the cached balance and version."""

    status: ApplyStatus
    entry_id: int = 0
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    done: bool = False

    @property
    def missing(self) -> bool:
        return self.status is ApplyStatus.MISSING

    @classmethod
    def parse(cls, raw) -> ApplyReply:
        status, *rest = reply_fields(raw)
        status = ApplyStatus(status)
        if status is ApplyStatus.OK:
            return cls(status, int(rest[0]), int(rest[1]), int(rest[2]), rest[3], rest[4])
        if status is ApplyStatus.REPLAY:
            return cls(status, int(rest[0]), int(rest[1]), int(rest[2]), done=rest[3] == "done")
        if status in (ApplyStatus.CLOSED, ApplyStatus.INSUFFICIENT, ApplyStatus.LIMIT):
            return cls(status, balance=int(rest[0]), version=int(rest[1]))
        return cls(status)


@dataclass(frozen=True)
class Charge:
    """One ASYNC charge as ledger_apply.lua takes it."""

    kind: str  # 'D' deduct | 'R' recharge
    user_id: int
    amount: int
    entry_id: int
    ts: int
    idem_key: str | None
    fingerprint: str  # '' without an Idempotency-Key


class LedgerScripts:
    def __init__(self, lua: Lua, stream_flag: str, entry_ttl_s: int, idempotency_ttl_s: int, max_balance: int,
                 idempotency_stale_ms: int):
        self.lua, self.stream_flag = lua, stream_flag
        self.entry_ttl_s, self.idempotency_ttl_s = entry_ttl_s, idempotency_ttl_s
        self.max_balance, self.idempotency_stale_ms = max_balance, idempotency_stale_ms

    def apply(self, c: Charge) -> ApplyReply:
        return ApplyReply.parse(self.lua.run(
            "ledger_apply",
            [keys.balance(c.user_id), keys.entry(c.user_id, c.entry_id), keys.consistency(c.user_id),
             keys.idempotency(c.user_id, c.idem_key or ""), keys.account_stream(c.user_id)],
            [c.kind, c.amount, c.ts, c.entry_id, self.entry_ttl_s, c.fingerprint, self.idempotency_ttl_s, self.max_balance,
             c.ts - self.idempotency_stale_ms, c.idem_key or "", self.stream_flag, c.user_id]))

    def rollback(self, user_id: int, entry_id: int, idem_key: str | None) -> bool:
        """Undo a charge whose event was not acknowledged; True when the writer claimed it first (it stands)."""
        reply = reply_fields(self.lua.run(
            "ledger_rollback", [keys.balance(user_id), keys.entry(user_id, entry_id), keys.consistency(user_id),
                                keys.fate(user_id, entry_id), keys.idempotency(user_id, idem_key or "")],
            [entry_id, self.entry_ttl_s]))
        return reply[0] == "claimed"
