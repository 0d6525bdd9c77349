"""Credit grants: the typed reply of ledger_grant_expire.lua (dal/script_reply.py parses it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger.dal.script_reply import ScriptReply


class ExpireStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    SYNC = "sync"
    GONE = "gone"  # no such grant, or nothing left of it (tidied, no entry)
    EARLY = "early"  # not due, or its credit not durable yet: later
    RECOVERING = "recovering"  # rebuilt after a Redis loss, its records maybe still in the log: later
    HELD = "held"  # as RECOVERING, this caller checks the writer's watermark (Ledger.lift_rebuild_hold)


@dataclass(frozen=True)
class ExpireReply(ScriptReply):
    """OK: the expiry entry's id, the amount it took (what was left), the balance, version, epoch and open flag after."""

    status: ExpireStatus
    entry_id: int = 0
    amount: int = 0
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    retry_at: int = 0  # RECOVERING, HELD: the script's clock the hold lasts until
    FIELDS = {
        ExpireStatus.OK: ("entry_id", "amount", "balance", "version", "epoch", "open_flag"),
        ExpireStatus.RECOVERING: ("retry_at",),
        ExpireStatus.HELD: ("retry_at",),
    }

    @property
    def missing(self) -> bool:
        return self.status is ExpireStatus.MISSING
