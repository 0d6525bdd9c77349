"""Holds: the typed replies of its Lua scripts and their parsers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from hotledger.dal.redis_store import reply_fields
from hotledger.holds.rows import ACTIVE
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
    def parse(cls, raw: Sequence[bytes | str | int]) -> HoldReply:
        head, *rest = reply_fields(raw)
        status = HoldStatus(head)
        if status is HoldStatus.OK:
            balance, version, epoch, open_flag, available, *change = rest
            amount, captured, state, released, expires_at = change or ("0", "0", ACTIVE, "0", "0")
            return cls(
                status,
                int(balance),
                int(version),
                epoch,
                open_flag,
                int(available),
                int(amount),
                int(captured),
                state,
                int(released),
                int(expires_at),
            )
        if status in (HoldStatus.CLOSED, HoldStatus.INSUFFICIENT):
            return cls(status, balance=int(rest[0]), version=int(rest[1]))
        if status is HoldStatus.ENDED:
            return cls(status, state=rest[0])
        if status is HoldStatus.EXCEEDS:
            return cls(status, remaining=int(rest[0]))
        return cls(status)

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
        )
