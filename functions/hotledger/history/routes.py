"""History routes: an account's entries (newest first, cursor pages), its balance at any time, statements."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from pydantic import BaseModel, Field

from api.responses import responses
from api.rules import ADMIN, SERVICE, only, path_arg
from hotledger import errors
from hotledger.history.feature import history
from hotledger.history.service import Filters, HistoryEntry
from hotledger.ledger.book import ENTRY_TYPES
from hotledger.runtime import currencies

router = Router()
UserId = Annotated[int, Path(gt=0, lt=2**31)]
_NOT_FOUND = (404, "ACCOUNT_NOT_FOUND")
_BEFORE_LEDGER = (
    422,
    "BEFORE_LEDGER: the time is before the account's opening entry (it held money before the ledger existed)",
)


class GrantSpent(BaseModel):
    grant_id: str
    amount: str


class EntryView(BaseModel):
    seq: int | None = Field(description="the account's entry number: gapless, strictly increasing; null while pending")
    entry_id: str = Field(description="the change's id (order_id, pay_id, ...) as a string")
    type: str = Field(description=", ".join(sorted(ENTRY_TYPES)))
    amount: str
    balance_change: str = Field(description="what the entry added to the balance (negative: taken)")
    balance_after: str = Field(description="the balance after this entry (pending: as charged in Redis)")
    available_after: str | None = Field(
        description="the balance less active holds after this entry; null while pending"
    )
    at: int | None = Field(
        description="epoch ms the ledger booked it (history and balances follow this time); null while pending"
    )
    charged_at: int = Field(description="epoch ms the change was made")
    ref: str | None = Field(
        description="what caused it: key:<Idempotency-Key>, payment_order:<id>, redpacket:<id>, ..."
    )
    state: str = Field(
        description="booked, or pending: charged, not in the DB yet (read your writes); a pending entry whose "
        "request has not been answered yet may still be taken back (its publish failed)"
    )
    grants_spent: list[GrantSpent] = Field(
        default_factory=list,
        description="the credit grants a deduct or capture spent, first-to-expire (the rest: plain balance)",
    )
    grants_refunded: list[GrantSpent] = Field(
        default_factory=list,
        description="the credit grants a refund gave back to, last-spent first (after the plain balance its charge "
        "took; a grant expired by then is never revived: its part stays in the plain balance)",
    )


class EntriesPage(BaseModel):
    entries: list[EntryView]
    next_cursor: str | None = Field(description="pass as cursor for the next (older) page; null: this was the last")


class BalanceView(BaseModel):
    balance: str
    available: str
    seq: int = Field(description="the last entry booked at or before `at` (0: none)")
    at: int = Field(description="the time asked for, epoch ms")


class StatementView(BaseModel):
    since: int
    until: int
    opening_balance: str = Field(description="after every entry booked before since")
    entries: list[EntryView] = Field(description="booked in [since, until), oldest first")
    closing_balance: str = Field(description="opening_balance + the entries' balance changes")


def _entry(e: HistoryEntry, format_minor: Callable[[int], str]) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "entry_id": str(e.entry_id),
        "type": e.type,
        "amount": format_minor(e.amount),
        "balance_change": format_minor(e.delta),
        "balance_after": format_minor(e.balance_after),
        "available_after": None if e.available_after is None else format_minor(e.available_after),
        "at": e.at,
        "charged_at": e.charged_at,
        "ref": e.ref,
        "state": e.state,
        "grants_spent": [{"grant_id": str(g), "amount": format_minor(a)} for g, a in e.grants_spent],
        "grants_refunded": [{"grant_id": str(g), "amount": format_minor(a)} for g, a in e.grants_refunded],
    }


def _filters(types: str | None, since: int | None, until: int | None) -> Filters | None:
    if types is None and since is None and until is None:
        return None
    wanted = tuple(sorted({t.strip() for t in (types or "").split(",") if t.strip()}))
    unknown = [t for t in wanted if t not in ENTRY_TYPES]
    if unknown:
        raise errors.InvalidFilter(f"types: unknown {', '.join(unknown)}; known: {', '.join(sorted(ENTRY_TYPES))}")
    if since is not None and until is not None and until <= since:
        raise errors.InvalidRange("until must be after since")
    return Filters(wanted, since, until)


@router.get(
    "/accounts/<user_id>/entries",
    responses=responses(
        200,
        EntriesPage,
        "the account's entries, newest first: the pending ones (first page only), then the booked ones",
        _NOT_FOUND,
        (422, "INVALID_CURSOR: not a cursor of this account, or made for other filters; VALIDATION_ERROR"),
    ),
)
def list_entries(
    user_id: UserId,
    limit: Annotated[
        int, Query(gt=0, le=1000, description="booked entries per page (the pending ones come on top)")
    ] = 100,
    cursor: Annotated[
        str | None, Query(min_length=1, max_length=512, description="the previous page's next_cursor, same filters")
    ] = None,
    types: Annotated[
        str | None,
        Query(max_length=512, description="entry types, comma-separated, such as grant_expiry,transfer_debit"),
    ] = None,
    since: Annotated[
        int | None,
        Query(ge=0, lt=2**53, description="epoch ms: entries booked (at; pending: charged_at) at or after it"),
    ] = None,
    until: Annotated[int | None, Query(ge=0, lt=2**53, description="epoch ms: entries booked before it")] = None,
) -> dict[str, Any]:
    page = history().entries(user_id, limit, cursor, _filters(types, since, until))
    format_minor = currencies().of(user_id).format
    return {"entries": [_entry(e, format_minor) for e in page.entries], "next_cursor": page.next_cursor}


@router.get(
    "/accounts/<user_id>/balance",
    responses=responses(200, BalanceView, "the balance at `at`", _NOT_FOUND, _BEFORE_LEDGER),
)
def balance_at(
    user_id: UserId,
    at: Annotated[int, Query(ge=0, lt=2**53, description="epoch ms: the balance after every entry booked by then")],
) -> dict[str, Any]:
    found = history().balance_at(user_id, at)
    format_minor = currencies().of(user_id).format
    return {
        "balance": format_minor(found.balance),
        "available": format_minor(found.available),
        "seq": found.seq,
        "at": at,
    }


@router.get(
    "/accounts/<user_id>/statement",
    responses=responses(
        200,
        StatementView,
        "opening balance, entries, closing balance",
        _NOT_FOUND,
        (
            422,
            "INVALID_RANGE: until is not after since; STATEMENT_TOO_LARGE: more than 1,000 entries, narrow the range; "
            + _BEFORE_LEDGER[1],
        ),
    ),
)
def statement(
    user_id: UserId,
    since: Annotated[
        int, Query(ge=0, lt=2**53, description="epoch ms: entries booked at or after it (opening_balance: before it)")
    ],
    until: Annotated[int, Query(ge=1, lt=2**53, description="epoch ms: entries booked before it")],
) -> dict[str, Any]:
    s = history().statement(user_id, since, until)
    format_minor = currencies().of(user_id).format
    return {
        "since": s.since,
        "until": s.until,
        "opening_balance": format_minor(s.opening.balance),
        "entries": [_entry(e, format_minor) for e in s.entries],
        "closing_balance": format_minor(s.closing.balance),
    }


# services and operators read any account's history, end users their own
RULES = {
    ("GET", "/accounts/<user_id>/entries"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
    ("GET", "/accounts/<user_id>/balance"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
    ("GET", "/accounts/<user_id>/statement"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
}
