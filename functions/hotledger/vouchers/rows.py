"""Vouchers: typed rows and values its store and transactions hand out."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

Slot = tuple[int, int, int]


# ---------------------------------------------------------------------------------------------------- DB rows
@dataclass(frozen=True)
class VoucherRow:
    voucher_id: int
    title: str
    initial_stock: int
    stock: int  # left in the DB: initial stock - orders persisted
    per_user_limit: int
    begin_at: int  # epoch ms
    end_at: int
    stock_shards: int = 1


@dataclass(frozen=True)
class VoucherSnapshot:
    """What voucher_load puts into Redis, read with the voucher row locked (no writer commit in between)."""

    stock: int
    begin_at: int
    end_at: int
    per_user_limit: int
    version: int  # the row's version: orders committed later are not in `stock`
    buyers: dict[int, int] = field(default_factory=dict)  # user id -> orders persisted
    bucket_stocks: tuple[int, ...] = ()  # bucket -> its stock left in the DB (empty: one bucket holding `stock`)

    @property
    def shards(self) -> int:
        return max(1, len(self.bucket_stocks))

    def bucket_stock(self, bucket: int) -> int:
        return self.bucket_stocks[bucket] if self.bucket_stocks else self.stock

    def bucket_buyers(self, bucket: int) -> dict[int, int]:
        """The buyers whose home is this bucket."""
        return {user: n for user, n in self.buyers.items() if home_bucket(user, self.shards) == bucket}


@dataclass(frozen=True)
class StockRow:
    stock: int
    version: int


@dataclass(frozen=True)
class OrderRow:
    order_id: int
    voucher_id: int
    user_id: int
    seq: int

    @property
    def slot(self) -> Slot:
        return self.voucher_id, self.user_id, self.seq


@dataclass(frozen=True)
class AwayOrder:
    """A buyer's slot reserved in the home bucket while the unit is taken from another one."""

    order_id: int
    user_id: int
    seq: int
    ts: int


def home_bucket(user_id: int, shards: int) -> int:
    """The bucket holding a buyer's record (orders taken) and trying first to sell to them: stable for the sale."""
    return zlib.crc32(str(user_id).encode()) % shards
