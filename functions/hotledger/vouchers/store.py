"""Vouchers' storage: typed wrappers of the voucher_*.lua scripts (keys tagged {v<id>}: one slot per voucher).
SQL of t_seckill_voucher / t_voucher_order joins here as the feature moves in."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal.redis_store import Lua, reply_fields


def voucher_keys(voucher_id: int) -> list[str]:
    return [keys.voucher(voucher_id), keys.voucher_buyers(voucher_id), keys.voucher_pending(voucher_id)]


class OrderStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    RECOVERING = "recovering"
    NOT_STARTED = "not_started"
    ENDED = "ended"
    SOLD_OUT = "sold_out"
    ALREADY = "already"


@dataclass(frozen=True)
class OrderReply:
    """voucher_order.lua's answer. `seq`/`epoch` when OK; `at` is the begin, end or retry time of a refusal."""

    status: OrderStatus
    seq: int = 0
    epoch: str = ""
    at: str = ""

    @property
    def missing(self) -> bool:
        return self.status is OrderStatus.MISSING

    @classmethod
    def parse(cls, raw) -> OrderReply:
        status, *rest = reply_fields(raw)
        status = OrderStatus(status)
        if status is OrderStatus.OK:
            return cls(status, seq=int(rest[0]), epoch=rest[1])
        return cls(status, at=rest[0] if rest and status is not OrderStatus.ALREADY else "")


class VoucherScripts:
    def __init__(self, lua: Lua, stream_flag: str, fate_ttl_s: int):
        self.lua, self.stream_flag, self.fate_ttl_s = lua, stream_flag, fate_ttl_s

    def order(self, voucher_id: int, user_id: int, order_id: int, now_ms: int) -> OrderReply:
        return OrderReply.parse(self.lua.run("voucher_order", [*voucher_keys(voucher_id), keys.voucher_stream(voucher_id)],
                                             [voucher_id, user_id, order_id, now_ms, self.stream_flag]))

    def rollback(self, voucher_id: int, order_id: int, user_id: int) -> bool:
        """Undo an order whose event was not acknowledged; True when the writer claimed it first (it stands)."""
        reply = reply_fields(self.lua.run("voucher_rollback", [*voucher_keys(voucher_id), keys.voucher_fate(voucher_id, order_id)],
                                          [order_id, user_id, self.fate_ttl_s]))
        return reply[0] == "claimed"
