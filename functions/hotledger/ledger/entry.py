"""A ledger entry: one deduct or recharge charged in Redis and not yet in the DB.

ledger_apply.lua writes it as the string 'amount;ts;balanceAfter;version;kind;epoch;open;idemKey' (idemKey may be
empty); the writer persists it from its event, the reconciler from the string when the event was lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from hotledger.ledger.kinds import HOLD_KINDS, KIND_REFUND, KINDS, balance_delta
from hotledger.outbox.events import LedgerEvent

T = TypeVar("T")


def carried(value: T | None, field: str) -> T:
    """A LedgerEvent field that its kind always carries (the model keeps it optional for the other kinds): a hold
    change's hold_id, a refund's refund_of. An event without it is refused (TypeError, as '%d' % None refused it)."""
    if value is None:
        raise TypeError(f"the event carries no {field}")
    return value


class ServiceKey(str):
    """An Idempotency-Key of the service's own charges (red packets rp<id> / rprefund<id>, payment orders
    payorder<id> / payorderrefund<id>). The ledger keeps these as they are and every client key under CLIENT_PREFIX,
    so a client key spelled like a service key never meets it (issue 10 item 3; Stripe scopes keys per caller)."""


CLIENT_PREFIX = "c:"


def stored_key(idem_key: str | None) -> str | None:
    """The key as the ledger stores it (Redis record, entry, t_idempotency, t_order/t_pay idem_key): a ServiceKey as
    it is, a client's key under 'c:' (the API's keys hold at most 100 characters: 102 fit the 128 of the columns)."""
    if not idem_key or isinstance(idem_key, ServiceKey):
        return idem_key or None
    return CLIENT_PREFIX + idem_key


def is_client_key(stored: str | None) -> bool:
    """Whether a stored key is a client's: those count against MAX_IDEMPOTENCY_KEYS (a client can mint any number);
    the service's own keys are one per packet, item or payment order, bounded by those."""
    return stored is not None and stored.startswith(CLIENT_PREFIX)


# not frozen: one is built per charge, and a frozen dataclass sets each field through object.__setattr__
@dataclass
class Entry:
    entry_id: int
    user_id: int
    amount: int
    ts: int
    balance_after: int
    version: int
    kind: str  # KIND_DEDUCT | KIND_RECHARGE
    epoch: str  # the cache load it was charged from
    open: str  # the open flag after it: '1', 'BALANCE' or 'ADMIN'
    idem_key: str | None = None
    hold: HoldChange | None = None  # a hold's change (kinds H, C, V, X)
    refund: RefundOf | None = None  # a refund (kind F)
    # credit grants: a deduct's or a capture's '<grant id>:<spent>,...', a granted recharge's '<expires_at>;<category>', a grant
    # expiry's '<grant id>;<expires_at>;<category>' (the grant it ends, so a take-back can restore it)
    grant: str | None = None

    @classmethod
    def parse(cls, user_id: int, entry_id: int, raw: str) -> Entry:
        amount, ts, balance_after, version, kind, epoch, open_, *rest = raw.split(";", 13)
        idem_key = rest[0] if rest and rest[0] else None
        hold = HoldChange.parse(kind, rest[1:]) if kind in HOLD_KINDS else None
        refund = RefundOf.parse(rest[1:]) if kind == KIND_REFUND else None
        k = KINDS[kind]
        if hold is not None:  # a capture's spent grants follow its captured total (HoldChange.parse)
            spent = rest[6].split(";")[2:] if k.spends_grants else []
            grant = spent[0] if spent and spent[0] else None
        else:
            grant = ";".join(rest[1:]) if (k.may_grant or k.spends_grants or k.ends_grant) and rest[1:] else None
        return cls(
            entry_id,
            user_id,
            int(amount),
            int(ts),
            int(balance_after),
            int(version),
            kind,
            epoch,
            open_,
            idem_key,
            hold,
            refund,
            grant,
        )

    @property
    def delta(self) -> int:
        return balance_delta(self.kind, self.amount)

    def to_event(self) -> LedgerEvent:
        return LedgerEvent(**self.event())

    def event(self) -> dict[str, Any]:
        """The event as published: a deduct's or recharge's without the hold fields (the bytes signed and sent stay
        what they were). Its fields are LedgerEvent's, from this entry's typed values: a charge does not build and
        dump the model to publish them (the writer validates every event it reads)."""
        fields: dict[str, Any] = {
            "type": "ledger",
            "id": self.entry_id,
            "kind": self.kind,
            "user_id": self.user_id,
            "amount": self.amount,
            "balance_after": self.balance_after,
            "version": self.version,
            "epoch": self.epoch,
            "ts": self.ts,
            "open": self.open,
            "idem_key": self.idem_key,
        }
        if self.hold is not None:
            fields.update(
                {
                    "hold_id": self.hold.hold_id,
                    "released": self.hold.released,
                    "expires_at": self.hold.expires_at,
                    "available_after": self.hold.available_after,
                    "hold_state": self.hold.state,
                }
            )
            fields.update(
                {"description": self.hold.description}
                if self.kind == "H"
                else {"captured_after": self.hold.captured_after}
            )
        if self.grant is not None:
            fields.update(grant_fields(self.kind, self.grant))
        if self.refund is not None:
            fields.update(
                {
                    "refund_of": self.refund.charge_id,
                    "refund_of_kind": self.refund.charge_kind,
                    "refunded_after": self.refund.refunded_after,
                    "reason": self.refund.reason,
                }
            )
            if self.refund.grants_refunded:
                fields["grants_refunded"] = self.refund.grants_refunded
        return fields


def grant_fields(kind: str, grant: str) -> dict[str, Any]:
    """An entry's grant field as its event's fields (the entry string's encodings: Entry.grant)."""
    k = KINDS[kind]
    if k.spends_grants:
        return {"grants_spent": grant}
    if k.may_grant:
        expires_at, category = grant.split(";", 1)
        return {"grant_expires_at": int(expires_at), "grant_category": category}
    return {"grant_id": int(grant.split(";", 1)[0])}


@dataclass(frozen=True)
class RefundOf:
    """The refund fields of an F entry string: chargeId;chargeKind;refundedAfter;grantsRefunded;reason (may hold ';')."""

    charge_id: int
    charge_kind: str  # 'order' | 'hold'
    refunded_after: int
    reason: str
    grants_refunded: str = ""  # '<grant id>:<part>,...' given back to the charge's live grants ('' for none)

    @classmethod
    def parse(cls, fields: list[str]) -> RefundOf:
        charge_id, charge_kind, refunded_after, grants_refunded, *reason = fields
        return cls(int(charge_id), charge_kind, int(refunded_after), ";".join(reason), grants_refunded)


@dataclass(frozen=True)
class HoldChange:
    """The hold fields of an H, C, V or X entry string: holdId;released;expiresAt;availableAfter;stateAfter, then
    the description (H, may hold ';') or '' and captured after (C, V, X), then a capture's spent grants when it spent
    any (Entry.grant)."""

    hold_id: int
    released: int
    expires_at: int
    available_after: int
    state: str
    description: str | None
    captured_after: int

    @classmethod
    def parse(cls, kind: str, fields: list[str]) -> HoldChange:
        hold_id, released, expires_at, available_after, state, tail = fields
        if kind == "H":
            return cls(int(hold_id), int(released), int(expires_at), int(available_after), state, tail, 0)
        captured_after = tail.split(";")[1]
        return cls(int(hold_id), int(released), int(expires_at), int(available_after), state, None, int(captured_after))


@dataclass(frozen=True)
class LedgerHead:
    """An account's ledger in the DB as its row holds it: the last seq and what follows from all entries so far."""

    seq: int
    balance: int
    on_hold: int  # what active holds keep out of available
    booked_at: int  # epoch ms of the last entry

    @property
    def available(self) -> int:
        return self.balance - self.on_hold


@dataclass(frozen=True)
class Booked:
    """One t_entry row."""

    user_id: int
    seq: int
    entry_id: int
    type: str
    amount: int
    delta: int  # added to the balance
    balance_after: int
    available_after: int
    booked_at: int
    charged_at: int
    ref: str | None
