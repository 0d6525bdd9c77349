"""Refunds: the typed replies of its Lua scripts, each stating its shape (dal/script_reply.py parses them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger.dal.script_reply import ScriptReply


class RefundStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    SYNC = "sync"
    UNKNOWN_TOTAL = "unknown_total"
    EXCEEDS = "exceeds"
    LIMIT = "limit"


@dataclass(frozen=True)
class RefundReply(ScriptReply):
    status: RefundStatus
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    refunded: int = 0  # the charge's refunded total after the refund (EXCEEDS: before it)
    charged: int = 0
    grants_refunded: str = ""  # OK: '<grant id>:<part>,...' given back to the charge's live grants ('' for none)

    FIELDS = {
        RefundStatus.OK: ("balance", "version", "epoch", "open_flag", "refunded", "grants_refunded"),
        RefundStatus.EXCEEDS: ("refunded", "charged"),
        RefundStatus.LIMIT: ("balance", "version"),
    }

    @property
    def missing(self) -> bool:
        return self.status is RefundStatus.MISSING
