"""What a webhook event is: one booked ledger entry (t_entry) of a subscribed type, named for receivers, with the
account's seq and the seq of the previous event of that account for the same endpoint, so a receiver can check the
order and see a gap (Stripe's receivers cannot)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from hotledger.ledger.entry import Booked
from hotledger.ledger.kinds import KINDS
from hotledger.money import format_minor

if TYPE_CHECKING:
    from hotledger.monitors.store import Alert

# the ledger's entry types -> the event types receivers subscribe to: each kind's (ledger/kinds.py), then the types
# of the entries a service's key caused (ledger/book.py type_and_ref)
EVENT_TYPES = {
    **{k.entry_type: k.event for k in KINDS.values()},
    "payment_charge": "payment_order.paid",
    "payment_refund": "payment_order.refunded",
    "redpacket_debit": "redpacket.sent",
    "redpacket_credit": "redpacket.grab_credited",
    "redpacket_refund": "redpacket.refunded",
    "transfer_credit": "transfer.credited",
    "transfer_release": "transfer.released",
    "opening": "account.opened",
}
BALANCE_TYPES = {"below": "balance.below", "above": "balance.above"}  # a balance monitor's crossing
ALL_TYPES = frozenset(EVENT_TYPES.values()) | frozenset(BALANCE_TYPES.values())


# what each ledger entry type means to a receiver (the OpenAPI document's `webhooks` section)
MEANING = {
    **{k.event: k.means for k in KINDS.values()},
    "payment_order.paid": "a payment order was paid from the balance",
    "payment_order.refunded": "a payment order's payment was given back",
    "redpacket.sent": "a red packet's total left the sender's balance",
    "redpacket.grab_credited": "a red packet grab was credited to the grabber",
    "redpacket.refunded": "what a red packet's grabbers left was given back to its sender",
    "transfer.credited": "a transfer's amount reached the payee's balance (its credit leg)",
    "transfer.released": "a failed transfer's debit was given back to the payer",
    "account.opened": "the account's opening balance",
    "balance.below": "the balance crossed a monitor's line downwards (once per crossing, re-armed past rearm_above)",
    "balance.above": "the balance crossed a monitor's line upwards (once per crossing, re-armed below rearm_below)",
}


class EntryEventData(BaseModel):
    event_id: str = Field(description="stable across retries and replays: the receiver's de-duplication key")
    user_id: int
    seq: int = Field(description="the entry's place in the account's ledger: gapless, rising")
    prev_seq: int | None = Field(
        description="seq of the previous event of this account sent to this endpoint (null: the "
        "first); a receiver that has not seen it missed one"
    )
    entry_id: str
    entry_type: str = Field(description="the ledger's type of the entry (deduct, recharge, refund, hold, capture, ...)")
    amount: str = Field(description="decimal string")
    balance_change: str = Field(description="decimal string, signed: what the entry added to the balance")
    balance_after: str
    available_after: str = Field(description="the balance less what holds and credits not yet durable keep")
    ref: str | None = Field(description="the entry's reference: the hold, order, packet or refund it belongs to")
    charged_at: int = Field(description="when the API accepted the change (epoch ms)")


class EntryEvent(BaseModel):
    type: Literal[tuple(EVENT_TYPES.values())]  # type: ignore[valid-type]
    timestamp: int = Field(description="when the entry was booked in the DB (epoch ms)")
    data: EntryEventData


class BalanceEventData(BaseModel):
    event_id: str = Field(description="stable across retries and replays: the receiver's de-duplication key")
    user_id: int
    seq: int = Field(description="the entry whose booking crossed the line")
    prev_seq: int | None = Field(description="seq of the previous event of this account sent to this endpoint")
    monitor_id: str
    threshold: str = Field(description="the monitor's line, a decimal string")
    balance: str = Field(description="the balance after the crossing entry, a decimal string")


class BalanceEvent(BaseModel):
    type: Literal[tuple(BALANCE_TYPES.values())]  # type: ignore[valid-type]
    timestamp: int = Field(description="when the crossing entry was booked (epoch ms)")
    data: BalanceEventData


def event_id(booked: Booked) -> str:
    """Stable across retries and replays: the receiver's de-duplication key."""
    return f"evt_{booked.entry_id}"


def payload(booked: Booked, prev_seq: int | None, decimals: int = 2) -> str:
    """The body as sent (and signed): Standard Webhooks' {type, timestamp, data}."""
    return EntryEvent(
        type=EVENT_TYPES[booked.type],
        timestamp=booked.booked_at,
        data=EntryEventData(
            event_id=event_id(booked),
            user_id=booked.user_id,
            seq=booked.seq,
            prev_seq=prev_seq,
            entry_id=str(booked.entry_id),
            entry_type=booked.type,
            amount=format_minor(booked.amount, decimals),
            balance_change=format_minor(booked.delta, decimals),
            balance_after=format_minor(booked.balance_after, decimals),
            available_after=format_minor(booked.available_after, decimals),
            ref=booked.ref,
            charged_at=booked.charged_at,
        ),
    ).model_dump_json()


def alert_event_id(alert: Alert) -> str:
    return f"evt_m{alert.monitor_id}_{alert.seq}"


def alert_payload(alert: Alert, prev_seq: int | None, decimals: int = 2) -> str:
    """A balance monitor's crossing: the entry (seq) whose booking took the balance past the line."""
    return BalanceEvent(
        type=BALANCE_TYPES[alert.direction],
        timestamp=alert.at,
        data=BalanceEventData(
            event_id=alert_event_id(alert),
            user_id=alert.user_id,
            seq=alert.seq,
            prev_seq=prev_seq,
            monitor_id=str(alert.monitor_id),
            threshold=format_minor(alert.threshold, decimals),
            balance=format_minor(alert.balance, decimals),
        ),
    ).model_dump_json()
