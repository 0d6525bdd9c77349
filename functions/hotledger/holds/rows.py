"""Holds: typed rows and values its store and transactions hand out."""

from __future__ import annotations

from dataclasses import dataclass

ACTIVE, CAPTURED, VOIDED, EXPIRED = "ACTIVE", "CAPTURED", "VOIDED", "EXPIRED"


@dataclass(frozen=True)
class Hold:
    hold_id: int
    user_id: int
    amount: int
    captured: int
    state: str
    expires_at: int
    created_at: int
    description: str

    def record(self) -> str:
        """As keys.holds keeps it."""
        return f"{self.amount};{self.captured};{self.state};{self.expires_at};{self.created_at};{self.description}"

    @classmethod
    def of_record(cls, user_id: int, hold_id: int, raw: str) -> Hold:
        amount, captured, state, expires_at, created_at, description = raw.split(";", 5)
        return cls(hold_id, user_id, int(amount), int(captured), state, int(expires_at), int(created_at), description)
