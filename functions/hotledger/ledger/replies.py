"""Ledger: the typed replies of its Lua scripts, each stating its shape (dal/script_reply.py parses them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Self

from hotledger.dal.redis_store import text
from hotledger.dal.script_reply import Fields, ScriptReply


# script replies --------------------------------------------------------------------------------------------
class ApplyStatus(Enum):
    OK = "ok"
    REPLAY = "replay"
    MISSING = "missing"
    SYNC = "sync"
    UNKNOWN_KEY = "unknown_key"  # Redis has no record of the Idempotency-Key: look it up in the DB first
    RECOVERING = "recovering"  # a new key on an account rebuilt after a Redis loss, within its time hold
    HELD = "held"  # ...past the time hold while the log hold is on: this caller checks it (outbox/log_hold.py)
    CLOSED = "closed"
    INSUFFICIENT = "insufficient"
    LIMIT = "limit"
    CONFLICT = "conflict"
    IN_PROGRESS = "in_progress"
    TOO_MANY_PENDING = "too_many_pending"  # the account holds its most entries not yet in the DB: retry later
    TOO_MANY_KEYS = "too_many_keys"  # the account opened its most client keys this window: a new one waits for the next


# not frozen: one is built per charge, and a frozen dataclass sets each field through object.__setattr__
@dataclass
class ApplyReply(ScriptReply):
    """ledger_apply.lua's answer. OK: the new entry's balance after, version, cache epoch and open flag.
    REPLAY: the first answer for the Idempotency-Key (entry_id, balance, version, the mode that charged it) and
    whether its event is known durable (`done`). CLOSED / INSUFFICIENT / LIMIT carry the balance and version the
    charge was refused at (the refusal may be the replayed first answer for its key). RECOVERING / HELD: when to
    retry (`retry_at`, epoch ms)."""

    status: ApplyStatus
    entry_id: int = 0
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    done: bool = False
    mode: str = "ASYNC"
    retry_at: int = 0
    grant: str = ""  # OK: the entry's grant field (a deduct's spent grants, a recharge's grant: ledger.entry.Entry)

    FIELDS = {
        ApplyStatus.OK: ("entry_id", "balance", "version", "epoch", "open_flag", "grant"),
        ApplyStatus.REPLAY: ("entry_id", "balance", "version", "done"),
        ApplyStatus.CLOSED: ("balance", "version"),
        ApplyStatus.INSUFFICIENT: ("balance", "version"),
        ApplyStatus.LIMIT: ("balance", "version"),
        ApplyStatus.RECOVERING: ("retry_at",),
        ApplyStatus.HELD: ("retry_at",),
    }
    CONVERT = {"done": lambda state: state == "done"}  # REPLAY: the key's state, 'done' or 'pending'

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int], fields: Mapping[Any, Fields] | None = None) -> Self:
        """An OK reply as redis-py gives it (bytes), every charge's, read here as the general parser reads it (the
        same values, in a fraction of its steps); any other reply by the general parser."""
        if fields is None and len(raw) == 7 and raw[0] == b"ok":
            _, entry_id, balance, version, epoch, open_flag, grant = raw
            if isinstance(epoch, bytes) and isinstance(open_flag, bytes) and isinstance(grant, bytes):
                return cls(
                    ApplyStatus.OK,
                    int(entry_id),
                    int(balance),
                    int(version),
                    epoch.decode(),
                    open_flag.decode(),
                    grant=grant.decode(),
                )
        return super().parse(raw, fields)

    @property
    def missing(self) -> bool:
        return self.status is ApplyStatus.MISSING


class RollbackStatus(Enum):
    GONE = "gone"  # nothing left to undo (rolled back or persisted already)
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class RollbackReply(ScriptReply):
    """ledger_rollback.lua's answer; balance/version after the money went back (None when the hash was lost)."""

    status: RollbackStatus
    balance: int | None = None
    version: int | None = None

    FIELDS = {RollbackStatus.ROLLED_BACK: ("balance", "version")}


class ToSyncStatus(Enum):
    OK = "ok"
    PENDING = "pending"


@dataclass(frozen=True)
class ToSyncReply(ScriptReply):
    """ledger_to_sync.lua's answer: PENDING with how many entries still wait for the DB."""

    status: ToSyncStatus
    pending: int = 0

    FIELDS = {ToSyncStatus.PENDING: ("pending",)}


class ReconcileStatus(Enum):
    OK = "ok"  # corrected
    SAME = "same"  # already right
    CHANGED = "changed"  # the cache was reloaded (or vanished, or turned SYNC) since the snapshot: next run


@dataclass(frozen=True)
class ReconcileReply(ScriptReply):
    status: ReconcileStatus
    version: int | None = None  # the new cached version when OK

    FIELDS = {ReconcileStatus.OK: ("version",)}


@dataclass(frozen=True)
class SettleReply:
    removed: int  # entry ids dropped from the pending set
    flagged: bool  # an entry was charged from an earlier cache load: the reconciler corrects the account


def settled(raw: bytes | str) -> bool:
    """ledger_settle keeps a persisted entry's string as 'settled;<entry string>' for a while, as resend evidence
    for ledger_apply: it is no pending entry."""
    return text(raw).startswith("settled;")
