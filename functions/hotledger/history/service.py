"""An account's history: its entries newest first in pages, its balance at any time, and statements.

Read your writes: the DB books an entry when the writer persists it, and the API acknowledges a charge before that;
the first page therefore starts with the account's pending entries (charged in Redis, not booked yet: no seq yet,
`state: "pending"`), then the booked ones. Pages after the first follow the booked entries by seq alone, so they are
stable while new entries arrive: a cursor says "older than seq n" with the filters it was made for, and a cursor
from one filter never pages another (Stripe's and Formance's users met cursors that dropped their filters)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass

from hotledger import errors
from hotledger.grants.rows import decode_spent
from hotledger.history.store import BalanceAt, BookedEntry, HistoryStore
from hotledger.ledger.book import ENTRY_TYPES, type_and_ref
from hotledger.ledger.entry import Entry

STATEMENT_MAX_ENTRIES = 1000
NEWEST = 2**62  # a seq past any account's last


@dataclass(frozen=True)
class Filters:
    types: tuple[str, ...] = ()  # sorted; empty: every type
    since: int | None = None  # booked_at >= since (epoch ms)
    until: int | None = None  # booked_at < until


@dataclass(frozen=True)
class HistoryEntry:
    seq: int | None  # None: pending (charged, not booked yet)
    entry_id: int
    type: str
    amount: int
    delta: int
    balance_after: int
    available_after: int | None  # None while pending
    at: int | None  # booked_at; None while pending
    charged_at: int
    ref: str | None
    state: str  # 'booked' | 'pending'
    grants_spent: tuple[tuple[int, int], ...] = ()  # (grant id, amount) a deduct or capture spent, first-to-expire
    grants_refunded: tuple[tuple[int, int], ...] = ()  # (grant id, amount) a refund gave back, last-spent first

    @classmethod
    def booked(cls, e: BookedEntry, grants: tuple[tuple[int, int], ...] = ()) -> HistoryEntry:
        """grants: its t_grant_spend rows (a refund's give-backs are the negative ones)."""
        return cls(
            e.seq,
            e.entry_id,
            e.type,
            e.amount,
            e.delta,
            e.balance_after,
            e.available_after,
            e.booked_at,
            e.charged_at,
            e.ref,
            "booked",
            tuple((g, a) for g, a in grants if a > 0),
            tuple((g, -a) for g, a in grants if a < 0),
        )

    @classmethod
    def pending(cls, e: Entry) -> HistoryEntry:
        entry_type, ref = type_and_ref(
            e.kind,
            e.idem_key,
            e.hold.hold_id if e.hold else None,
            f"{e.refund.charge_kind}:{e.refund.charge_id}" if e.refund else None,
            e.to_event().grant_id if e.grant else None,
        )
        return cls(
            None,
            e.entry_id,
            entry_type,
            e.amount,
            e.delta,
            e.balance_after,
            e.hold.available_after if e.hold else None,
            None,
            e.ts,
            ref,
            "pending",
            tuple(decode_spent(e.to_event().grants_spent)) if e.grant else (),
            tuple(decode_spent(e.refund.grants_refunded)) if e.refund else (),
        )


@dataclass(frozen=True)
class Page:
    entries: list[HistoryEntry]
    next_cursor: str | None


@dataclass(frozen=True)
class Statement:
    since: int
    until: int
    opening: BalanceAt
    entries: list[HistoryEntry]
    closing: BalanceAt


class History:
    def __init__(
        self,
        store: HistoryStore,
        pending_entries: Callable[[int], list[Entry]],
        is_known_account: Callable[[int], bool],
    ) -> None:
        """pending_entries(user_id) -> the account's entries charged in Redis and not in the DB yet (the ledger's);
        is_known_account(user_id) -> bool."""
        self.store, self.pending_entries, self.is_known_account = store, pending_entries, is_known_account

    def entries(self, user_id: int, limit: int, cursor: str | None, filters: Filters | None) -> Page:
        self._account(user_id)
        if cursor is not None:
            before, carried = decode_cursor(user_id, cursor)
            if filters is not None and filters != carried:
                raise errors.InvalidCursor(
                    "this cursor was made for other filters: send it without filters, or start again without a cursor"
                )
            filters = carried
        else:
            before, filters = NEWEST, filters or Filters()
        pending = self._pending(user_id, filters) if cursor is None else []
        low = self.store.first_seq_from(user_id, filters.since) if filters.since is not None else 1
        high = before - 1
        if filters.until is not None:
            high = min(high, self.store.first_seq_from(user_id, filters.until) - 1)
        booked = self.store.page(user_id, low, high, filters.types, limit + 1) if high >= low else []
        more = len(booked) > limit
        booked = booked[:limit]
        next_cursor = encode_cursor(user_id, booked[-1].seq, filters) if more else None
        # an entry the writer committed after the pending read is on this page already (the newest seqs come first)
        on_page = {e.entry_id for e in booked}
        pending = [e for e in pending if e.entry_id not in on_page]
        return Page(pending + self._with_grants(booked), next_cursor)

    def balance_at(self, user_id: int, at_ms: int) -> BalanceAt:
        self._account(user_id)
        return self.store.balance_at(user_id, at_ms)

    def statement(self, user_id: int, since: int, until: int) -> Statement:
        """Opening balance (after every entry booked before since), the entries booked in [since, until), closing
        balance (after every entry booked before until): opening + the entries' deltas = closing."""
        self._account(user_id)
        if until <= since:
            raise errors.InvalidRange("until must be after since")
        low, high = self.store.first_seq_from(user_id, since), self.store.first_seq_from(user_id, until) - 1
        entries = (
            self.store.page(user_id, low, high, (), STATEMENT_MAX_ENTRIES + 1, newest_first=False)
            if high >= low
            else []
        )
        if len(entries) > STATEMENT_MAX_ENTRIES:
            raise errors.StatementTooLarge(
                f"more than {STATEMENT_MAX_ENTRIES} entries in this range: narrow it, or page "
                "through GET /accounts/{id}/entries with since and until"
            )
        return Statement(
            since,
            until,
            self.store.balance_at(user_id, since - 1),
            self._with_grants(entries),
            self.store.balance_at(user_id, until - 1),
        )

    def _with_grants(self, booked: list[BookedEntry]) -> list[HistoryEntry]:
        """The booked entries with the grants each spent or gave back (t_grant_spend)."""
        spent = self.store.grants_spent([e.entry_id for e in booked])
        return [HistoryEntry.booked(e, spent.get(e.entry_id, ())) for e in booked]

    def _account(self, user_id: int) -> None:
        if not self.is_known_account(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")

    def _pending(self, user_id: int, filters: Filters) -> list[HistoryEntry]:
        entries = self.pending_entries(user_id)
        booked = self.store.booked_ids(user_id, [e.entry_id for e in entries])  # committed, not settled yet
        shown = [
            HistoryEntry.pending(e)
            for e in sorted(entries, key=lambda e: (e.version, e.entry_id), reverse=True)
            if e.entry_id not in booked
        ]
        return [
            e
            for e in shown
            if (not filters.types or e.type in filters.types)
            and (filters.since is None or e.charged_at >= filters.since)
            and (filters.until is None or e.charged_at < filters.until)
        ]


def encode_cursor(user_id: int, before_seq: int, filters: Filters) -> str:
    body = {"u": user_id, "b": before_seq, "t": list(filters.types), "s": filters.since, "e": filters.until}
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(user_id: int, cursor: str) -> tuple[int, Filters]:
    """(before_seq, the filters it carries); InvalidCursor for anything this API did not hand out for this account."""
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        before, types, since, until = body["b"], body["t"], body["s"], body["e"]
        valid = (
            body["u"] == user_id
            and type(before) is int
            and before > 0
            and isinstance(types, list)
            and all(t in ENTRY_TYPES for t in types)
            and types == sorted(set(types))
            and all(v is None or type(v) is int for v in (since, until))
        )
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        valid = False
    if not valid:
        raise errors.InvalidCursor("the cursor is not one this API handed out for this account")
    return before, Filters(tuple(types), since, until)
