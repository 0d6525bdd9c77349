"""Ledger: typed rows and values its store and transactions hand out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hotledger.grants.rows import GrantCredit
from hotledger.ledger.entry import LedgerHead

MAX_BALANCE = 9_000_000_000_000_000  # below 2**53: exact in Redis Lua doubles


def open_flag(api_open: int, close_reason: str | None) -> str:
    """The DB columns as the flag; closed without a reason counts as an operator's close."""
    return "1" if api_open else (close_reason or "ADMIN")


def open_columns(flag: str) -> tuple[int, str | None]:
    """The flag as the DB columns (api_open, close_reason)."""
    return (1, None) if flag == "1" else (0, flag)


@dataclass(frozen=True)
class AccountRow:
    """An account as the DB holds it (t_user joined with t_account)."""

    user_id: int
    user_name: str
    deduct_type: str  # 'ASYNC' | 'SYNC'
    balance: int
    version: int
    threshold: int
    seq: int
    on_hold: int
    booked_at: int
    open_flag: str

    @classmethod
    def of(cls, row: Sequence[Any]) -> AccountRow:
        user_id, user_name, deduct_type, balance, version, threshold, seq, on_hold, booked_at, api_open, reason = row
        return cls(
            user_id,
            user_name,
            deduct_type,
            balance,
            version,
            threshold,
            seq,
            on_hold,
            booked_at,
            open_flag(api_open, reason),
        )

    @property
    def head(self) -> LedgerHead:
        return LedgerHead(self.seq, self.balance, self.on_hold, self.booked_at)


@dataclass(frozen=True)
class LockedAccount:
    """An account row the writer locked: its highest applied version and its ledger head."""

    version: int
    head: LedgerHead


@dataclass(frozen=True)
class AccountBalance:
    """An account's DB balance and version, as the reconciler pages through them."""

    user_id: int
    deduct_type: str
    balance: int
    version: int


@dataclass(frozen=True)
class CachedAccount:
    """The account hash in Redis."""

    balance: int
    version: int
    threshold: int
    open_flag: str
    held: int = 0  # credits in the balance whose events are not durable yet: not spendable
    on_hold: int = 0  # what live holds keep (expired ones left out): not spendable


@dataclass(frozen=True)
class CacheState:
    """What the reconciler checks of an account in Redis: the cached balance and version (None when not cached),
    the writer's 'dirty' flag, how many entry ids are pending, the charge time (ms) of the oldest (None when none)
    and the ids charged before the stale moment, oldest first (at most the reconciler's per-account limit)."""

    balance: int | None
    version: int | None
    dirty: bool
    pending_count: int
    oldest_ms: float | None
    stale: list[int]


@dataclass(frozen=True)
class CacheSnapshot:
    """The cached balance and the pending entry ids at one instant (one MULTI): the base of a correction. `epoch`
    names the cache load, `total` counts the pending ids (`ids` holds at most the limit asked for)."""

    balance: int
    epoch: str
    mode: str
    ids: list[int]
    total: int


@dataclass(frozen=True)
class StoredDeduct:
    amount: int
    balance_after: int


@dataclass(frozen=True)
class IdempotentAnswer:
    """The first answer for an Idempotency-Key, with the fingerprint of its request: a charge (the LedgerResult
    fields: entry_id, user_id, amount, balance, version, mode), or a refusal ({'refused': the ApplyStatus value,
    'balance', 'version'}). Written with a SYNC charge or refusal, with an ASYNC refusal, and by the writer with the
    ASYNC entry it persists; never deleted (a key is answered the same for good)."""

    fingerprint: str
    answer: dict[str, Any]


@dataclass(frozen=True)
class AccountMove:
    """How a batch of persisted entries moves one account: the sum of their deltas, their highest version, and
    the open flag to write (None: the DB has seen a newer change already, the flag stays)."""

    user_id: int
    delta: int
    version: int
    open_flag: str | None
    head: LedgerHead  # the account's ledger after the batch's entries (seq, on_hold and booked_at are written)


# not frozen: one is built per charge, and a frozen dataclass sets each field through object.__setattr__
@dataclass
class Charge:
    """One ASYNC charge as ledger_apply.lua takes it."""

    kind: str  # KIND_DEDUCT | KIND_RECHARGE
    user_id: int
    amount: int
    entry_id: int
    ts: int
    idem_key: str | None
    fingerprint: str  # '' without an Idempotency-Key
    key_checked: bool = False  # the DB holds no answer for the key: charge even if Redis has no record of it
    refusal_final: bool = False  # a business refusal is the key's answer (recorded with the key)
    grant: GrantCredit | None = None  # a recharge's credit grant (grants/)
