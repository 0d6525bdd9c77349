"""Red packets' storage: typed wrappers of the redpacket_*.lua scripts (keys tagged {rp<id>}: one slot per packet).
SQL of t_red_packet / t_red_packet_item joins here as the feature moves in."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal.redis_store import Lua, reply_fields


def packet_keys(packet_id: int) -> list[str]:
    return [keys.packet(packet_id), keys.packet_unclaimed(packet_id), keys.packet_grabbers(packet_id)]


class GrabStatus(Enum):
    OK = "ok"
    MISSING = "missing"
    NOT_OPEN = "not_open"
    EXPIRED = "expired"
    RECOVERING = "recovering"
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
    def parse(cls, raw) -> GrabReply:
        status, *rest = reply_fields(raw)
        status = GrabStatus(status)
        if status in (GrabStatus.OK, GrabStatus.ALREADY):
            return cls(status, item_id=int(rest[0]), amount=int(rest[1]))
        return cls(status, detail=rest[0] if rest else "")


class PacketScripts:
    def __init__(self, lua: Lua, stream_flag: str, fate_ttl_s: int):
        self.lua, self.stream_flag, self.fate_ttl_s = lua, stream_flag, fate_ttl_s

    def grab(self, packet_id: int, user_id: int, grab_id: int, now_ms: int) -> GrabReply:
        return GrabReply.parse(self.lua.run(
            "redpacket_grab", [*packet_keys(packet_id), keys.packet_pending(packet_id), keys.packet_stream(packet_id)],
            [packet_id, user_id, now_ms, grab_id, self.stream_flag]))

    def rollback(self, packet_id: int, grab_id: int, item_id: int, user_id: int, amount: int) -> bool:
        """Undo a grab whose claim was not acknowledged; True when the writer claimed it first (it stands)."""
        reply = reply_fields(self.lua.run(
            "redpacket_rollback", [keys.packet_unclaimed(packet_id), keys.packet_grabbers(packet_id),
                                   keys.packet_pending(packet_id), keys.packet_fate(packet_id, grab_id)],
            [item_id, user_id, amount, self.fate_ttl_s]))
        return reply[0] == "claimed"
