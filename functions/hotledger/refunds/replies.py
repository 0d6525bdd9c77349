"""Refunds: the typed replies of its Lua scripts and their parsers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from hotledger.dal.redis_store import reply_fields


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
    def parse(cls, raw: Sequence[bytes | str | int]) -> RefundReply:
        head, *rest = reply_fields(raw)
        status = RefundStatus(head)
        if status is RefundStatus.OK:
            return cls(status, int(rest[0]), int(rest[1]), rest[2], rest[3], int(rest[4]))
        if status is RefundStatus.EXCEEDS:
            return cls(status, refunded=int(rest[0]), charged=int(rest[1]))
        if status is RefundStatus.LIMIT:
            return cls(status, balance=int(rest[0]), version=int(rest[1]))
        return cls(status)
