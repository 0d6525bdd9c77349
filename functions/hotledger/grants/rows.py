"""Credit grants (issue 34): money credited by a recharge that carries `grant` (expires_at, category), spent before
the plain balance, first-to-expire, and taken off the balance by an expiry entry (kind G) at expires_at. The rules
here are pure: the scripts (layers/lua/lib/grants.lua) keep the same ones for an ASYNC account, the SYNC path reads
them from here."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from hotledger.ledger.entry import Entry

CATEGORY = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
ACTIVE, EXPIRED = "ACTIVE", "EXPIRED"


@dataclass(frozen=True)
class Grant:
    grant_id: int  # its recharge's entry id
    user_id: int
    remaining: int
    expires_at: int  # epoch ms
    category: str

    def record(self) -> str:
        """The grant as the account's grants hash keeps it (lib/grants.lua grant_record)."""
        return f"{self.remaining};{self.expires_at};{self.category}"

    @classmethod
    def parse(cls, grant_id: int, user_id: int, raw: str) -> Grant:
        remaining, expires_at, category = raw.split(";", 2)
        return cls(grant_id, user_id, int(remaining), int(expires_at), category)

    def live(self, now_ms: int) -> bool:
        return self.expires_at > now_ms


@dataclass(frozen=True)
class GrantCredit:
    """What a recharge's `grant` asks for."""

    expires_at: int
    category: str

    def field(self) -> str:
        """A granted recharge's part of its Idempotency-Key's fingerprint: '<expires_at>:<category>'."""
        return f"{self.expires_at}:{self.category}"


def expired_remaining(grants: list[Grant], now_ms: int) -> int:
    """What the grants past expires_at still hold: never counted in available (lib/grants.lua grants_expired)."""
    return sum(g.remaining for g in grants if not g.live(now_ms))


def live_remaining(grants: list[Grant], now_ms: int) -> int:
    """What the live grants have left: out of a plain-only debit's reach (lib/grants.lua grants_live; a SYNC account's
    grants are all durable, committed with their recharge)."""
    return sum(g.remaining for g in grants if g.live(now_ms))


def spend(grants: list[Grant], amount: int, now_ms: int) -> list[tuple[int, int]]:
    """(grant id, spent) taken from the live grants first-to-expire (lib/grants.lua grants_spend); what is left of
    amount comes from the plain balance."""
    spent: list[tuple[int, int]] = []
    for g in sorted((g for g in grants if g.live(now_ms)), key=lambda g: (g.expires_at, str(g.grant_id))):
        if amount <= 0:
            break
        take = min(g.remaining, amount)
        if take > 0:
            amount -= take
            spent.append((g.grant_id, take))
    return spent


def refund_parts(
    spent: list[tuple[int, int]], charged: int, refunded_before: int, amount: int
) -> list[tuple[int, int]]:
    """(grant id, part) of a refund of `amount` that each grant its charge spent gets back (lib/grants.lua
    grants_refund_parts). A refund undoes its charge from the end: first what the charge took of the plain balance,
    then its grants last-spent first (`spent` in spend order), so what each refund gives back follows from the
    charge's refunded total before it alone, however the refunds are split."""
    plain = charged - sum(a for _, a in spent)
    skip = max(refunded_before - plain, 0)  # what refunds before this one gave back to the grants
    left = amount - min(max(plain - refunded_before, 0), amount)
    parts: list[tuple[int, int]] = []
    for grant_id, part in reversed(spent):
        if left <= 0:
            break
        from_skip = min(skip, part)
        skip -= from_skip
        take = min(part - from_skip, left)
        if take > 0:
            left -= take
            parts.append((grant_id, take))
    return parts


def encode_spent(spent: list[tuple[int, int]]) -> str | None:
    return ",".join(f"{grant_id}:{amount}" for grant_id, amount in spent) or None


def decode_spent(encoded: str | None) -> list[tuple[int, int]]:
    return [(int(g), int(a)) for g, a in (part.split(":") for part in encoded.split(","))] if encoded else []


def grants_with_pending(
    stored: list[Grant], missing: list[Entry], booked_spends: Callable[[list[int]], Mapping[int, int]]
) -> list[Grant]:
    """The DB's grants with the entries charged in Redis that the DB does not hold yet applied: a granted recharge
    makes its grant, a deduct or capture spends, a refund gives back, an expiry ends one. What a cache load puts back in Redis (as
    ledger.service.expected_cache does for the balance). booked_spends(grant ids): what the spends the DB booked took
    net of each; a grant booked after spends of it (the broker lost its log) starts from what they left, as the books
    start it (grants.tx insert_grant_changes)."""
    grants = {g.grant_id: g for g in stored}
    changes = sorted((e for e in missing if e.grant is not None or e.refund is not None), key=lambda e: e.version)
    events = [(e, e.to_event()) for e in changes]
    spent_before = booked_spends([e.entry_id for e, event in events if event.grant_expires_at is not None])
    for e, event in events:
        if event.grant_expires_at is not None and event.grant_category is not None:
            left = max(e.amount - spent_before.get(e.entry_id, 0), 0)
            grants[e.entry_id] = Grant(e.entry_id, e.user_id, left, event.grant_expires_at, event.grant_category)
        elif event.grant_id is not None:
            grants.pop(event.grant_id, None)
        spent = decode_spent(event.grants_spent) + [(g, -a) for g, a in decode_spent(event.grants_refunded)]
        for grant_id, amount in spent:  # a refund's give-back: a negative spend
            if grant_id in grants:
                grants[grant_id] = replace(grants[grant_id], remaining=max(grants[grant_id].remaining - amount, 0))
    return list(grants.values())
