"""Redpackets: the typed replies of its Lua scripts, each stating its shape (dal/script_reply.py parses them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger.dal.script_reply import ScriptReply


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
class GrabReply(ScriptReply):
    """redpacket_grab.lua's answer: the item (OK, ALREADY), the packet state (NOT_OPEN) or the retry time (RECOVERING)."""

    status: GrabStatus
    item_id: int = 0
    amount: int = 0
    detail: str = ""

    FIELDS = {
        GrabStatus.OK: ("item_id", "amount"),
        GrabStatus.ALREADY: ("item_id", "amount"),
        GrabStatus.NOT_OPEN: ("detail",),
        GrabStatus.RECOVERING: ("detail",),
        GrabStatus.HELD: ("detail",),
    }

    @property
    def missing(self) -> bool:
        return self.status is GrabStatus.MISSING


class ExpireStatus(Enum):
    MISSING = "missing"
    OPEN = "open"  # not expired yet
    NOT_OPEN = "not_open"  # CREATING or FAILED
    EXPIRED = "expired"  # closed to grabs now or before


@dataclass(frozen=True)
class ExpireReply(ScriptReply):
    """redpacket_expire.lua's answer; when EXPIRED, how many claims are still on their way to the DB, the end of
    the time hold after a rebuild (epoch ms) and its log hold ('': none)."""

    status: ExpireStatus
    state: str = ""
    claims_pending: int = 0
    hold_until: int = 0
    hold_log: str = ""

    FIELDS = {
        ExpireStatus.EXPIRED: ("claims_pending", "hold_until", "hold_log"),
        ExpireStatus.NOT_OPEN: ("state",),
    }

    @property
    def missing(self) -> bool:
        return self.status is ExpireStatus.MISSING
