"""Booking: every balance change of an account becomes one row of its ledger in the DB (t_entry), numbered by the
account's next `seq` under the account row lock, with the balance and the available balance after it.

Why the DB numbers the entries, not the Lua script: a script's counter cannot stay gapless and unique across a Redis
loss. Entries acknowledged by the lost Redis are still on their way through the broker when the account is loaded
again from the DB and charged anew, so two changes would carry one number. The script stamps `version` (the order
of changes within one Redis), the writer books a batch's entries in version order, and the DB's seq follows the
commits: gapless, strictly increasing, never reused, also across a SYNC/ASYNC switch (the SYNC path books under the
same row lock). booked_at never goes back within an account, so seq order and time order agree and a balance at
any time is the balance_after of one row.

Invariant (statement): opening balance + the sum of the entries' deltas = closing balance, for any range of seq."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from hotledger.ledger.entry import CLIENT_PREFIX, Booked, LedgerHead
from hotledger.ledger.kinds import HOLD_TYPES, KIND_REFUND, KINDS


class Change(Protocol):
    """What the writer and the SYNC path book: a ledger event (outbox.events.LedgerEvent) or a SYNC charge. Read
    only: booking reads a change, never sets it (so a frozen model or a narrower type, e.g. a Literal kind, fits)."""

    @property
    def id(self) -> int: ...

    @property
    def user_id(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def amount(self) -> int: ...

    @property
    def version(self) -> int: ...

    @property
    def ts(self) -> int: ...

    @property
    def idem_key(self) -> str | None: ...

    @property
    def hold_id(self) -> int | None: ...

    @property
    def refund_of(self) -> int | None: ...

    @property
    def refund_of_kind(self) -> str | None: ...

    @property
    def grant_id(self) -> int | None: ...

    @property
    def delta(self) -> int: ...

    @property
    def hold_delta(self) -> int: ...


# the service's own Idempotency-Keys name what caused a charge (redpackets/store.py, notices/payment_orders.py); the
# longer prefix first
_SERVICE_KEYS = (
    ("payorderrefund", "payment_refund", "payment_order"),
    ("payorder", "payment_charge", "payment_order"),
    ("rprefund", "redpacket_refund", "redpacket"),
    # transfers/store.py: a transfer's debit of the payer, credit of the payee, and the debit given back
    ("transferdebit", "transfer_debit", "transfer"),
    ("transfercredit", "transfer_credit", "transfer"),
    ("transferrelease", "transfer_release", "transfer"),
)


# every type a ledger row may have: the opening's, each kind's, and those of the entries a service's key caused
ENTRY_TYPES = frozenset(
    {"opening", "redpacket_debit", "redpacket_credit"}
    | {k.entry_type for k in KINDS.values()}
    | {entry_type for _, entry_type, _ in _SERVICE_KEYS}
)


def type_and_ref(
    kind: str,
    idem_key: str | None,
    hold_id: int | None = None,
    refund_of: str | None = None,
    grant_id: int | None = None,
) -> tuple[str, str | None]:
    """(type, ref) of a change: a hold's (ref: the hold), a grant's expiry (ref: the grant), a payment order's charge
    and refund, a red packet's debit, credit and refund, or a client's change of another kind (its kind's entry type;
    ref: its Idempotency-Key)."""
    if kind in HOLD_TYPES:
        return HOLD_TYPES[kind], f"hold:{hold_id}"
    if KINDS[kind].ends_grant:
        return KINDS[kind].entry_type, f"grant:{grant_id}"
    if kind == KIND_REFUND:
        return "refund", refund_of
    plain = KINDS[kind].entry_type
    if not idem_key:
        return plain, None
    if idem_key.startswith(CLIENT_PREFIX):
        return plain, "key:" + idem_key[len(CLIENT_PREFIX) :]
    for prefix, entry_type, ref in _SERVICE_KEYS:
        if idem_key.startswith(prefix):
            return entry_type, f"{ref}:{idem_key[len(prefix) :]}"
    if idem_key.startswith("rp"):  # the packet's debit (a deduct) or one item's credit (a recharge)
        return (
            ("redpacket_debit", f"redpacket:{idem_key[2:]}")
            if KINDS[kind].balance < 0
            else ("redpacket_credit", f"redpacket_item:{idem_key[2:]}")
        )
    return plain, None


def refund_ref(change: Change) -> str | None:
    """What a refund gives back: 'order:<id>' or 'hold:<id>'."""
    return f"{change.refund_of_kind}:{change.refund_of}" if change.kind == KIND_REFUND else None


def book(
    changes: Iterable[Change], heads: dict[int, LedgerHead], now_ms: int
) -> tuple[list[Booked], dict[int, LedgerHead]]:
    """The rows of the changes, each account's in version order after its head, and each account's new head.
    Accounts without a head are left out (the caller dead-letters their changes)."""
    by_account: dict[int, list[Change]] = defaultdict(list)
    for change in changes:
        if change.user_id in heads:
            by_account[change.user_id].append(change)
    rows: list[Booked] = []
    moved: dict[int, LedgerHead] = {}
    for user_id, account_changes in by_account.items():
        head = heads[user_id]
        booked_at = max(now_ms, head.booked_at)
        for change in sorted(account_changes, key=lambda c: (c.version, c.id)):
            # made directly: dataclasses.replace costs a few times more, once per row of the writer's batches
            head = LedgerHead(head.seq + 1, head.balance + change.delta, head.on_hold + change.hold_delta, booked_at)
            entry_type, ref = type_and_ref(
                change.kind, change.idem_key, change.hold_id, refund_ref(change), change.grant_id
            )
            rows.append(
                Booked(
                    user_id,
                    head.seq,
                    change.id,
                    entry_type,
                    change.amount,
                    change.delta,
                    head.balance,
                    head.available,
                    booked_at,
                    change.ts,
                    ref,
                )
            )
        moved[user_id] = head
    return rows, moved
