"""A transfer as t_transfer keeps it."""

from __future__ import annotations

from dataclasses import dataclass

PENDING, DEBITED, CREDITED, POSTED, RELEASING, FAILED = (
    "PENDING",
    "DEBITED",
    "CREDITED",
    "POSTED",
    "RELEASING",
    "FAILED",
)
FINAL = (POSTED, FAILED)
# the debit is made (or may be) and neither the credit nor the release is: the amount is in flight
IN_FLIGHT = (DEBITED, RELEASING)


@dataclass(frozen=True)
class Transfer:
    transfer_id: int
    from_id: int
    to_id: int
    amount: int  # minor units of currency
    currency: str
    description: str
    state: str
    debit_id: int | None = None
    credit_id: int | None = None
    release_id: int | None = None
    failure: str | None = None  # "CODE: message" of what failed it
    created_at: int = 0
    updated_at: int = 0
