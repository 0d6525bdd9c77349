"""Vouchers: the typed replies of its Lua scripts and their parsers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from hotledger.dal.redis_store import reply_fields


# ---------------------------------------------------------------------------------------------- script replies
class OrderStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    RECOVERING = "recovering"
    HELD = "held"  # rebuilt and waiting for the writer's log watermark: this caller checks it (outbox/log_hold.py)
    NOT_STARTED = "not_started"
    ENDED = "ended"
    SOLD_OUT = "sold_out"
    ALREADY = "already"
    AWAY = "away"  # the home bucket is empty: the buyer's slot is reserved there, the unit is to come from `probes`


@dataclass(frozen=True)
class OrderReply:
    """voucher_order.lua's (and voucher_take.lua's) answer. `seq`/`epoch`/`bucket` when OK (the unit's bucket);
    `seq`/`probes` when AWAY; `at` is the begin, end or retry time of a refusal."""

    status: OrderStatus
    seq: int = 0
    epoch: str = ""
    at: str = ""
    bucket: int = 0
    probes: tuple[int, ...] = ()

    @property
    def missing(self) -> bool:
        return self.status is OrderStatus.MISSING

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int]) -> OrderReply:
        head, *rest = reply_fields(raw)
        status = OrderStatus(head)
        if status is OrderStatus.OK:
            return cls(status, seq=int(rest[0]), epoch=rest[1], bucket=int(rest[3]))
        if status is OrderStatus.AWAY:
            return cls(status, seq=int(rest[0]), probes=tuple(int(b) for b in rest[1:]))
        return cls(status, at=rest[0] if rest and status is not OrderStatus.ALREADY else "")

    @classmethod
    def parse_take(cls, raw: Sequence[bytes | str | int], seq: int, bucket: int) -> OrderReply:
        head, *rest = reply_fields(raw)
        status = OrderStatus(head)
        if status is OrderStatus.OK:
            return cls(status, seq=seq, epoch=rest[0], bucket=bucket)
        return cls(status, at=rest[0] if rest else "", bucket=bucket)


@dataclass(frozen=True)
class SettleReply:
    """voucher_settle.lua's answer for one voucher."""

    removed: int  # orders dropped from pending
    counted_late: int  # orders of an earlier load, counted into the rebuilt stock now


class ReconcileStatus(Enum):
    MISSING = "missing"
    SAME = "same"
    CORRECTED = "corrected"


@dataclass(frozen=True)
class ReconcileReply:
    """voucher_reconcile.lua's answer: the Redis stock found and the one it holds now."""

    status: ReconcileStatus
    stock_before: int = 0
    stock_after: int = 0

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int]) -> ReconcileReply:
        head, *rest = reply_fields(raw)
        status = ReconcileStatus(head)
        if status is ReconcileStatus.SAME:
            return cls(status, int(rest[0]), int(rest[0]))
        if status is ReconcileStatus.CORRECTED:
            return cls(status, int(rest[0]), int(rest[1]))
        return cls(status)
