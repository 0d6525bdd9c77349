"""The account's rulebook: every kind of ledger entry declared once (issue 31).

An entry's kind letter travels in the entry string Redis keeps (layers/lua: amount;ts;...;kind;...), in the event
on the topic and in the DB's rows. What a kind does to an account is read from this table, never from a branch on
the letter: its effect on the balance and on what holds keep out of `available`, the table its row goes to, the
ledger type it is booked under, whether it changes a hold or gives a charge back, and what of it waits for its
event to be durable. TigerBeetle's one transfer with flags is the model: one record of what each kind is.

A new kind is a row here, its Lua in the script that makes it, and its route: the writer books it, the reconciler
persists it and the history shows it from this row.

This module imports nothing of the project's: every layer (events, entries, persisters) may read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Sign = Literal[-1, 0, 1]


@dataclass(frozen=True)
class Kind:
    letter: str
    entry_type: str  # t_entry.type (a deduct or recharge is refined by what caused it: ledger/book.type_and_ref)
    balance: Sign  # the balance moves by balance * amount
    table: str  # the row of the change: t_order, t_pay, t_hold_change or t_refund
    amount_column: str  # that table's amount column
    changes_hold: bool = False  # a change of one hold (its fields travel with it: hold_id, hold_state, ...)
    refunds: bool = False  # gives part of a charge back (refund_of, refund_of_kind)
    waits_for_durable: bool = False  # what it makes spendable or lets end waits for its event (ledger_post)
    holds_amount: Sign = 0  # what holds keep from available moves by holds_amount * amount (released: see below)
    releases: bool = False  # what holds keep also drops by what it releases (a void, an expiry, a final capture)
    refundable_as: Literal["order", "hold"] | None = None  # a refund names a charge of this kind so
    # made by ledger_apply and its row written by the ledger (insert_events): a debit (balance -1) is refused on a
    # closed API or below the threshold, a credit (+1) above the largest balance
    applied: bool = False
    # the webhook event a booked entry of this kind is sent as (webhooks/events.py; an entry a service's key caused is
    # sent as what it caused), and what it means to a receiver
    event: str = ""
    means: str = ""
    # credit grants (issue 34): a recharge may carry a grant (its id is the entry's); a deduct or a capture spends the
    # live grants first-to-expire, then the plain balance; a grant expiry takes what is left of its grant off the balance
    may_grant: bool = False
    spends_grants: bool = False
    ends_grant: bool = False
    # a debit of plain money only (a transfer's): the live grants' remaining is out of its reach, as held money is,
    # and it spends none, so promo credit never leaves its account (issue 34)
    plain_only: bool = False


_ADJUSTMENT_MEANS = "an operator's adjustment of the balance is in the ledger (up or down: its balance_change)"

KINDS: dict[str, Kind] = {
    k.letter: k
    for k in (
        Kind(
            "D",
            "deduct",
            -1,
            "t_order",
            "amount",
            refundable_as="order",
            applied=True,
            spends_grants=True,
            event="charge.persisted",
            means="a deduct is in the ledger",
        ),
        # a transfer's debit of the payer (transfers/): a deduct of plain money only, so the payee never receives the
        # payer's promo credit as money of its own, nor the payer gets it back as plain money on a release
        Kind(
            "T",
            "transfer_debit",
            -1,
            "t_order",
            "amount",
            applied=True,
            plain_only=True,
            event="transfer.debited",
            means="a transfer's amount left the payer's balance (its debit leg, plain money only; ref transfer:<id>)",
        ),
        Kind(
            "R",
            "recharge",
            1,
            "t_pay",
            "pay",
            waits_for_durable=True,
            applied=True,
            may_grant=True,
            event="recharge.persisted",
            means="a recharge is in the ledger",
        ),
        Kind(
            "F",
            "refund",
            1,
            "t_refund",
            "amount",
            refunds=True,
            event="refund.persisted",
            means="a refund of a charge or a captured hold is in the ledger",
        ),
        Kind(
            "H",
            "hold",
            0,
            "t_hold_change",
            "amount",
            changes_hold=True,
            holds_amount=1,
            event="hold.authorized",
            means="a hold was placed",
        ),
        # a capture takes from the balance what it captures, and from what the hold keeps that and what it releases;
        # a partial capture keeps its hold from ending until its event is durable (the hold's inflight count)
        Kind(
            "C",
            "capture",
            -1,
            "t_hold_change",
            "amount",
            changes_hold=True,
            holds_amount=-1,
            releases=True,
            refundable_as="hold",
            spends_grants=True,
            event="hold.captured",
            means="a hold was captured (in part or the rest)",
        ),
        Kind(
            "V",
            "void",
            0,
            "t_hold_change",
            "amount",
            changes_hold=True,
            releases=True,
            event="hold.voided",
            means="a hold was voided",
        ),
        Kind(
            "X",
            "expiry",
            0,
            "t_hold_change",
            "amount",
            changes_hold=True,
            releases=True,
            event="hold.expired",
            means="a hold expired uncaptured",
        ),
        # an operator's adjustment of the balance (ops/routes.py), up (A) or down (N): down is refused and spends the
        # live grants first as a deduct does, up is spendable once durable as a recharge is
        Kind(
            "A",
            "adjustment",
            1,
            "t_adjustment",
            "amount",
            waits_for_durable=True,
            applied=True,
            event="adjustment.persisted",
            means=_ADJUSTMENT_MEANS,
        ),
        Kind(
            "N",
            "adjustment",
            -1,
            "t_adjustment",
            "amount",
            applied=True,
            spends_grants=True,
            event="adjustment.persisted",
            means=_ADJUSTMENT_MEANS,
        ),
        Kind(
            "G",
            "grant_expiry",
            -1,
            "t_grant_expiry",
            "amount",
            ends_grant=True,
            event="grant.expired",
            means="what was left of a credit grant left the balance at its expires_at (ref grant:<id>)",
        ),
    )
}
KIND_DEDUCT, KIND_RECHARGE, KIND_REFUND, KIND_GRANT_EXPIRY, KIND_TRANSFER_DEBIT = "D", "R", "F", "G", "T"
KIND_ADJUST_UP, KIND_ADJUST_DOWN = "A", "N"
HOLD_KINDS = frozenset(letter for letter, k in KINDS.items() if k.changes_hold)
HOLD_TYPES = {letter: KINDS[letter].entry_type for letter in sorted(HOLD_KINDS)}
ENTRY_TABLES = {letter: (k.table, k.amount_column) for letter, k in KINDS.items()}
APPLIED_KINDS = tuple(letter for letter, k in KINDS.items() if k.applied)
ORDER_KINDS = frozenset(letter for letter, k in KINDS.items() if k.table == KINDS[KIND_DEDUCT].table)  # GET .../orders


def balance_delta(kind: str, amount: int) -> int:
    """What an entry of this kind adds to the balance."""
    return KINDS[kind].balance * amount


LUA_KIND_SETS: dict[str, Callable[[Kind], bool]] = {
    "KIND_DEBITS": lambda k: k.balance < 0,
    "KIND_WAITS_FOR_DURABLE": lambda k: k.waits_for_durable,
    "KIND_CHANGES_HOLD": lambda k: k.changes_hold,
    "KIND_REFUNDS": lambda k: k.refunds,
    "KIND_SPENDS_GRANTS": lambda k: k.spends_grants,
    "KIND_ENDS_GRANT": lambda k: k.ends_grant,
    "KIND_PLAIN_ONLY": lambda k: k.plain_only,
}


def lua_kinds() -> str:
    """The table as the scripts read it (lib/kinds, expanded by dal.redis_store.script_text): one source for both.
    Each property is a string of the letters that have it, a constant of the compiled script: a Lua table would be
    built again on every call of the hot path."""
    sets = "\n".join(
        f"local {name} = '{''.join(k.letter for k in KINDS.values() if has(k))}'" for name, has in LUA_KIND_SETS.items()
    )
    return (
        "-- lib/kinds: ledger/kinds.py KINDS, generated (lua_kinds); kind_in(KIND_DEBITS, kind): whether it is one\n"
        f"{sets}\n"
        "local function kind_in(letters, kind) return #kind == 1 and string.find(letters, kind, 1, true) ~= nil end\n"
    )


def hold_delta(kind: str, amount: int, released: int) -> int:
    """What an entry of this kind adds to what holds keep out of available. A void or an expiry carries what it
    released as its amount (it releases the rest of the hold); a capture releases what it takes and, final, the rest."""
    k = KINDS[kind]
    if k.holds_amount:
        return k.holds_amount * amount - (released if k.releases else 0)
    return -amount if k.releases else 0
