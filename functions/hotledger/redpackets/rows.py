"""Redpackets: typed rows and values its store and transactions hand out."""

from __future__ import annotations

from dataclasses import dataclass


# DB ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PacketRow:
    """One t_red_packet row (expires_at in epoch ms; refund is set once the refund began)."""

    packet_id: int
    sender_id: int
    state: str  # CREATING | OPEN | FAILED | REFUNDING | REFUNDED
    total: int
    count: int
    refund: int | None
    expires_at: int


@dataclass(frozen=True)
class ItemRow:
    """One t_red_packet_item row; user_id and claimed_at (epoch ms) are set once its claim is persisted."""

    item_id: int
    packet_id: int
    amount: int
    user_id: int | None = None
    claimed_at: int | None = None
    refunded: bool = False


@dataclass(frozen=True)
class ClaimedItem:
    """A grab the DB holds whose credit is not marked yet; in_ledger: t_pay has the credit's row."""

    item_id: int
    user_id: int
    amount: int
    in_ledger: bool
