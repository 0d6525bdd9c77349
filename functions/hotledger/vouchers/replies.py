"""Vouchers: the typed replies of its Lua scripts, each stating its shape (dal/script_reply.py parses them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, ClassVar, Self

from hotledger.dal.script_reply import Fields, ScriptReply


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
class OrderReply(ScriptReply):
    """voucher_order.lua's (and voucher_take.lua's) answer. `seq`/`epoch`/`bucket` when OK (the unit's bucket);
    `seq`/`probes` when AWAY; `at` is the begin, end or retry time of a refusal."""

    status: OrderStatus
    seq: int = 0
    epoch: str = ""
    at: str = ""
    bucket: int = 0
    probes: tuple[int, ...] = ()

    FIELDS = {
        OrderStatus.OK: ("seq", "epoch", None, "bucket"),  # None: the stock left, not kept
        OrderStatus.AWAY: ("seq", "probes"),
        OrderStatus.NOT_STARTED: ("at",),
        OrderStatus.ENDED: ("at",),
        OrderStatus.RECOVERING: ("at",),
        OrderStatus.HELD: ("at",),
    }
    TAKE_FIELDS: ClassVar[Mapping[OrderStatus, Fields]] = {
        OrderStatus.OK: ("epoch",),
        OrderStatus.RECOVERING: ("at",),
        OrderStatus.HELD: ("at",),
    }

    @property
    def missing(self) -> bool:
        return self.status is OrderStatus.MISSING

    @classmethod
    def parse_take(cls, raw: Sequence[bytes | str | int], seq: int, bucket: int) -> OrderReply:
        """voucher_take.lua's answer: its OK carries the epoch only; the buyer's slot and this bucket are the caller's."""
        reply = cls.parse(raw, cls.TAKE_FIELDS)
        return replace(reply, seq=seq if reply.status is OrderStatus.OK else 0, bucket=bucket)


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
class ReconcileReply(ScriptReply):
    """voucher_reconcile.lua's answer: the Redis stock found and the one it holds now."""

    status: ReconcileStatus
    stock_before: int = 0
    stock_after: int = 0

    FIELDS = {ReconcileStatus.SAME: ("stock_before",), ReconcileStatus.CORRECTED: ("stock_before", "stock_after")}

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int], fields: Mapping[Any, Fields] | None = None) -> Self:
        # SAME's one value is the stock both before and after: a field filled twice, which FIELDS cannot state
        reply = super().parse(raw, fields)
        return replace(reply, stock_after=reply.stock_before) if reply.status is ReconcileStatus.SAME else reply
