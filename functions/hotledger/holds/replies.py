"""Holds: the typed replies of its Lua scripts, each stating its shape (dal/script_reply.py parses them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger.dal.script_reply import ScriptReply
from hotledger.ledger.entry import carried
from hotledger.outbox.events import LedgerEvent


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
    RECOVERING = "recovering"
    HELD = "held"


@dataclass(frozen=True)
class HoldReply(ScriptReply):
    """hold_change.lua's answer. OK: the account after it (balance, version, epoch, open flag,
    available), what the entry moved and the hold after it, and what a capture spent of the account's grants. ENDED: the state it ended in;
    EXCEEDS: what is left to capture."""

    FIELDS = {
        HoldStatus.OK: (
            "balance",
            "version",
            "epoch",
            "open_flag",
            "available",
            "amount",
            "captured",
            "state",
            "released",
            "expires_at",
            "grants_spent",
        ),
        HoldStatus.CLOSED: ("balance", "version"),
        HoldStatus.INSUFFICIENT: ("balance", "version"),
        HoldStatus.ENDED: ("state",),
        HoldStatus.EXCEEDS: ("remaining",),
        HoldStatus.RECOVERING: ("retry_at",),
        HoldStatus.HELD: ("retry_at",),
    }

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
    retry_at: int = 0
    grants_spent: str = ""  # OK: a capture's '<grant id>:<spent>,...' ('' for none: ledger.entry.Entry.grant)

    @property
    def missing(self) -> bool:
        return self.status is HoldStatus.MISSING

    @classmethod
    def booked(cls, change: LedgerEvent) -> HoldReply:
        """A change the SYNC path made (Ledger.change_in_db), as the script answers one it made (OK); its event carries
        the hold's fields (an authorize's, no captured_after: nothing is captured yet)."""
        return cls(
            HoldStatus.OK,
            change.balance_after,
            change.version,
            available=carried(change.available_after, "available_after"),
            amount=change.amount,
            captured=change.captured_after or 0,
            state=carried(change.hold_state, "hold_state"),
            released=change.released,
            grants_spent=change.grants_spent or "",
        )
