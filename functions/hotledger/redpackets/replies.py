"""Redpackets: the typed replies of its Lua scripts and their parsers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from hotledger.dal.redis_store import reply_fields


class GrabStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    NOT_OPEN = "not_open"
    EXPIRED = "expired"
    RECOVERING = "recovering"
    HELD = "held"  # rebuilt and waiting for the writer's log watermark: this caller checks it (outbox/log_hold.py)
    ALREADY = "already"
    EMPTY = "empty"


@dataclass(frozen=True)
class GrabReply:
    """redpacket_grab.lua's answer: the item (OK, ALREADY), the packet state (NOT_OPEN) or the retry time (RECOVERING)."""

    status: GrabStatus
    item_id: int = 0
    amount: int = 0
    detail: str = ""

    @property
    def missing(self) -> bool:
        return self.status is GrabStatus.MISSING

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int]) -> GrabReply:
        head, *rest = reply_fields(raw)
        status = GrabStatus(head)
        if status in (GrabStatus.OK, GrabStatus.ALREADY):
            return cls(status, item_id=int(rest[0]), amount=int(rest[1]))
        return cls(status, detail=rest[0] if rest else "")


class ExpireStatus(Enum):
    MISSING = "missing"
    OPEN = "open"  # not expired yet
    NOT_OPEN = "not_open"  # CREATING or FAILED
    EXPIRED = "expired"  # closed to grabs now or before


@dataclass(frozen=True)
class ExpireReply:
    """redpacket_expire.lua's answer; when EXPIRED, how many claims are still on their way to the DB, the end of
    the time hold after a rebuild (epoch ms) and its log hold ('': none)."""

    status: ExpireStatus
    state: str = ""
    claims_pending: int = 0
    hold_until: int = 0
    hold_log: str = ""

    @property
    def missing(self) -> bool:
        return self.status is ExpireStatus.MISSING

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int]) -> ExpireReply:
        head, *rest = reply_fields(raw)
        status = ExpireStatus(head)
        if status is ExpireStatus.EXPIRED:
            return cls(status, claims_pending=int(rest[0]), hold_until=int(rest[1]), hold_log=rest[2])
        return cls(status, state=rest[0] if rest else "")
