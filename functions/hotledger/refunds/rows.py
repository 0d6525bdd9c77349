"""Refunds: typed rows and values its store and transactions hand out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refund:
    refund_id: int
    user_id: int
    charge_id: int
    charge_kind: str
    amount: int
    refunded_after: int | None  # the charge's refunded total after it (None: read from the DB, not kept there)
