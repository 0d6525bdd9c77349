"""What a webhook event is: one booked ledger entry (t_entry) of a subscribed type, named for receivers, with the
account's seq and the seq of the previous event of that account for the same endpoint, so a receiver can check the
order and see a gap (Stripe's receivers cannot)."""
from __future__ import annotations

import json

from hotledger.ledger.entry import Booked
from hotledger.money import format_minor

# the ledger's entry types -> the event types receivers subscribe to
EVENT_TYPES = {
    "deduct": "charge.persisted", "recharge": "recharge.persisted", "refund": "refund.persisted",
    "hold": "hold.authorized", "capture": "hold.captured", "void": "hold.voided", "expiry": "hold.expired",
    "payment_charge": "payment_order.paid", "payment_refund": "payment_order.refunded",
    "redpacket_debit": "redpacket.sent", "redpacket_credit": "redpacket.grab_credited",
    "redpacket_refund": "redpacket.refunded", "opening": "account.opened",
}
BALANCE_TYPES = {"below": "balance.below", "above": "balance.above"}  # a balance monitor's crossing
ALL_TYPES = frozenset(EVENT_TYPES.values()) | frozenset(BALANCE_TYPES.values())


def event_id(booked: Booked) -> str:
    """Stable across retries and replays: the receiver's de-duplication key."""
    return f"evt_{booked.entry_id}"


def payload(booked: Booked, prev_seq: int | None) -> str:
    """The body as sent (and signed): Standard Webhooks' {type, timestamp, data}."""
    return json.dumps({
        "type": EVENT_TYPES[booked.type], "timestamp": booked.booked_at,
        "data": {"event_id": event_id(booked), "user_id": booked.user_id, "seq": booked.seq, "prev_seq": prev_seq,
                 "entry_id": str(booked.entry_id), "entry_type": booked.type, "amount": format_minor(booked.amount),
                 "balance_change": format_minor(booked.delta), "balance_after": format_minor(booked.balance_after),
                 "available_after": format_minor(booked.available_after), "ref": booked.ref,
                 "charged_at": booked.charged_at},
    }, separators=(",", ":"))


def alert_event_id(alert) -> str:
    return f"evt_m{alert.monitor_id}_{alert.seq}"


def alert_payload(alert, prev_seq: int | None) -> str:
    """A balance monitor's crossing: the entry (seq) whose booking took the balance past the line."""
    return json.dumps({
        "type": BALANCE_TYPES[alert.direction], "timestamp": alert.at,
        "data": {"event_id": alert_event_id(alert), "user_id": alert.user_id, "seq": alert.seq, "prev_seq": prev_seq,
                 "monitor_id": str(alert.monitor_id), "threshold": format_minor(alert.threshold),
                 "balance": format_minor(alert.balance)},
    }, separators=(",", ":"))
