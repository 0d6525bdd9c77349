"""Accounts, deducts and recharges.

ASYNC accounts are charged by one Lua script on Redis (balance, entry string, pending set and
idempotency record in one step), then the change is made durable (Durability.apply: the event is
published and the answer given only after the broker acknowledged it; a failed publish is rolled back
in Redis and tombstoned so the writer never persists it). SYNC accounts are charged in one DB
transaction under the account lock, then the cached hash is brought up to date.

Invariants:
- a charge is answered only once it is durable, undone, or reported OUTCOME_UNKNOWN with its entry id;
- the same Idempotency-Key with the same request answers the first definitive outcome, a charge or a business
  refusal (402, 403, 422), for good; with another request (another kind, account or amount) 409. Transient
  failures (503) are no answer: the key may try again. Redis keeps an ASYNC key's record for a day; the DB
  (t_idempotency) keeps every answer for good and is asked when Redis has no record of a key; on an account
  rebuilt after a Redis loss, a key neither knows waits (RECOVERING) until the writer applied the log as it was at
  the rebuild, as the key's first charge may have been acknowledged and still be on its way to the DB;
- a deduct never takes the balance below the threshold, a recharge never above MAX_BALANCE;
- the API closes ('BALANCE') when a deduct leaves the balance <= 0 and a recharge that makes it positive
  reopens it; an operator's close ('ADMIN') only an operator reopens; an operator's close or reopen takes a
  version of its own, so no entry charged before it can undo it;
- the cached balance of an ASYNC account is the DB balance plus every entry charged in Redis and not in the DB.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeGuard

from hotledger import errors, keys
from hotledger.dal.db import CommitOutcomeUnknown
from hotledger.dal.lock import DistributedLock, Holding
from hotledger.dal.publisher import NotAcknowledged
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.grants.rows import (
    Grant,
    GrantCredit,
    encode_spent,
    expired_remaining,
    grants_with_pending,
    live_remaining,
    spend,
)
from hotledger.holds.store import holds_with_pending
from hotledger.ledger.book import book
from hotledger.ledger.entry import Entry, ServiceKey, stored_key
from hotledger.ledger.kinds import KIND_DEDUCT, KIND_RECHARGE, KINDS, ORDER_KINDS, balance_delta
from hotledger.ledger.replies import ApplyReply, ApplyStatus, ToSyncStatus
from hotledger.ledger.rows import MAX_BALANCE, AccountRow, Charge, IdempotentAnswer
from hotledger.ledger.store import LedgerStore
from hotledger.ledger.tx import LedgerTx
from hotledger.money import MAX_MINOR, format_minor
from hotledger.outbox.durable import LOAD_ATTEMPTS, Durability, Outbound
from hotledger.outbox.events import LedgerEvent
from hotledger.outbox.log_hold import HOLD_CHECK_MS, LogHold

if TYPE_CHECKING:
    from hotledger.ledger.tx import Cursor


# not frozen: one is built per charge, and a frozen dataclass sets each field through object.__setattr__
@dataclass
class LedgerResult:
    entry_id: int
    user_id: int
    amount: int
    balance: int
    version: int
    mode: str


@dataclass(frozen=True)
class Account:
    user_id: int
    user_name: str
    balance: int
    version: int
    threshold: int
    deduct_type: str
    api_open: bool
    pending_orders: int
    held_credits: int = 0
    held: int = 0  # what live holds keep
    grants: tuple[Grant, ...] = ()  # the live credit grants with something left, first-to-expire
    expired_grants: int = 0  # what grants past expires_at still hold until their expiry entry: never spendable

    @property
    def available(self) -> int:
        """What a deduct or a new hold may spend from (down to the threshold)."""
        return self.balance - self.held_credits - self.held - self.expired_grants


@dataclass(frozen=True)
class DeductEntry:
    """A deduct as its lookup shows it: PENDING (in Redis, not in the DB yet), PERSISTED, or ROLLED_BACK (the DB
    recorded it rolled back for good; Redis gives it back on the next pass of the reconciler)."""

    entry_id: int
    user_id: int
    amount: int
    balance_after: int
    status: str


@dataclass(frozen=True)
class KeyedCharge:
    """The entry charged with an Idempotency-Key: PENDING in Redis (charged at `ts`, epoch ms) or PERSISTED."""

    entry_id: int
    persisted: bool
    ts: int | None = None


# rules -------------------------------------------------------------------------------------------------
def after_change(kind: str, balance: int, open_flag: str) -> str:
    """The open flag after a change of this kind left `balance`: a debit leaving it <= 0 closes the API; a credit
    making it positive reopens it (not an ADMIN close)."""
    sign = KINDS[kind].balance
    if sign < 0 and balance <= 0 and open_flag == "1":
        return "BALANCE"
    if sign > 0 and balance > 0 and open_flag == "BALANCE":
        return "1"
    return open_flag


def fingerprint(kind: str, user_id: int, amount: int, grant: str | None = None) -> str:
    """What an Idempotency-Key is bound to: the same key with another request is a conflict (a recharge's grant is
    part of it: GrantCredit.field)."""
    request = f"{kind}:{user_id}:{amount}" if grant is None else f"{kind}:{user_id}:{amount}:{grant}"
    return hashlib.sha256(request.encode()).hexdigest()


_REFUSALS: dict[ApplyStatus, Callable[[ApplyReply], errors.DomainError]] = {
    ApplyStatus.CLOSED: lambda r: errors.ApiClosed(
        "the account's API is closed (balance exhausted or closed by an operator)"
    ),
    ApplyStatus.INSUFFICIENT: lambda r: errors.InsufficientBalance(
        f"balance {format_minor(r.balance)} minus the amount would fall below the account threshold"
    ),
    ApplyStatus.LIMIT: lambda r: errors.BalanceLimit("the balance would exceed the largest supported balance"),
    ApplyStatus.CONFLICT: lambda r: errors.IdempotencyKeyReused(
        "this Idempotency-Key was used with a different request"
    ),
    ApplyStatus.IN_PROGRESS: lambda r: errors.IdempotencyInProgress(
        "the first request with this Idempotency-Key is still in progress"
    ),
    ApplyStatus.TOO_MANY_PENDING: lambda r: errors.TooManyPending(
        "the account holds its most charges not yet in the DB; retry when they are persisted"
    ),
    ApplyStatus.RECOVERING: lambda r: _recovering(r.retry_at),
    ApplyStatus.HELD: lambda r: _recovering(r.retry_at),
    ApplyStatus.TOO_MANY_KEYS: lambda r: errors.TooManyKeys(
        "this account opened its most Idempotency-Keys for now (MAX_IDEMPOTENCY_KEYS per 24 h): retry later, or replay "
        "a key it holds"
    ),
}


def _recovering(retry_at: int) -> errors.DomainError:
    return errors.Recovering(
        "the account is being restored after a cache failure: a charge under an Idempotency-Key it does not know "
        "waits until the charges acknowledged before the failure are in the DB; retry in a few seconds",
        retry_at=str(retry_at),
    )


# the business refusals: each is the definitive answer for its Idempotency-Key (TigerBeetle: id_already_failed;
# Stripe replays the stored error), unlike a transient failure (503), which changed nothing and may be retried
BUSINESS_REFUSALS = frozenset({ApplyStatus.CLOSED, ApplyStatus.INSUFFICIENT, ApplyStatus.LIMIT})
# most accounts a process remembers as SYNC (Ledger.charge): a hint, so a full memo is simply emptied
SYNC_ACCOUNTS_REMEMBERED = 10_000


# ...except for the service's own keys (ServiceKey: red packet debits rp<id>, credits rp<item id>, refunds rprefund<id>,
# payment orders payorder<id>): their callers keep the outcome in their own state (a FAILED packet, an OPEN payment
# order, a credit to retry) and charge again under the same key once the cause is gone (a pay after a top-up), so a
# refusal is not their answer. Client keys are stored under their own prefix (entry.stored_key): the two never meet.
def refusal_is_answer(idem_key: str | None) -> TypeGuard[str]:
    """Whether a business refusal is this key's answer for good (every client key, never a ServiceKey)."""
    return bool(idem_key) and not isinstance(idem_key, ServiceKey)


def refusal(reply: ApplyReply) -> errors.DomainError | None:
    """The domain error of a charge the script refused; None when it was not refused."""
    refuse = _REFUSALS.get(reply.status)
    return refuse(reply) if refuse else None


def refusal_answer(reply: ApplyReply) -> dict[str, Any]:
    """A business refusal as t_idempotency keeps it (enough to answer it again with the same message)."""
    return {"refused": reply.status.value, "balance": reply.balance, "version": reply.version}


def stored_reply(seen: IdempotentAnswer, request: str) -> ApplyReply:
    """The answer the DB holds for a key, as ledger_apply.lua would answer it: CONFLICT for another request, the
    refusal, or REPLAY of the charge (durable: it is in the DB or its event was acknowledged)."""
    if seen.fingerprint != request:
        return ApplyReply(ApplyStatus.CONFLICT)
    answer = seen.answer
    if "refused" in answer:
        return ApplyReply(ApplyStatus(answer["refused"]), balance=answer["balance"], version=answer["version"])
    return ApplyReply(
        ApplyStatus.REPLAY, answer["entry_id"], answer["balance"], answer["version"], done=True, mode=answer["mode"]
    )


def refused_in_db(kind: str, amount: int, account: AccountRow, on_hold: int = 0) -> ApplyReply | None:
    """ledger_apply.lua's refusals for a SYNC account (with the balance and version refused at); None: allowed.
    on_hold: what the account's live holds keep."""
    if KINDS[kind].balance < 0:
        if account.open_flag != "1":
            return ApplyReply(ApplyStatus.CLOSED, balance=account.balance, version=account.version)
        if account.balance - on_hold - amount < account.threshold:
            return ApplyReply(ApplyStatus.INSUFFICIENT, balance=account.balance, version=account.version)
    elif account.balance + amount > MAX_BALANCE:
        return ApplyReply(ApplyStatus.LIMIT, balance=account.balance, version=account.version)
    return None


def charged_in_db(kind: str, amount: int, account: AccountRow) -> tuple[int, str]:
    """ledger_apply.lua's rules for a SYNC account that allowed the charge: (the balance after, the open flag after)."""
    balance = account.balance + balance_delta(kind, amount)
    return balance, after_change(kind, balance, account.open_flag)


def expected_cache(
    tx: LedgerTx, store: LedgerStore, account: AccountRow
) -> tuple[int, str, list[Entry], tuple[int, ...]]:
    """(balance, open flag, pending entries, the ids of those the DB does not hold) the cache must start from: the
    DB's, plus every change charged in Redis that the DB does not hold yet; the open flag of the newest of those when it is newer than the DB's version (an
    operator's close or reopen takes a version of its own, so an older entry's flag never undoes it). Call inside the
    transaction that locked the t_account row, so no writer commits in between."""
    pending = store.pending_entries(account.user_id)
    in_db = tx.stored_entries([(e.entry_id, e.kind) for e in pending])
    missing = [e for e in pending if e.entry_id not in in_db]
    newest = max(missing, key=lambda e: e.version, default=None)
    flag = newest.open if newest is not None and newest.version > account.version else account.open_flag
    return account.balance + sum(e.delta for e in missing), flag, pending, tuple(e.entry_id for e in missing)


def _outcome_unknown(kind: str, user_id: int, entry_id: int, why: str) -> errors.DomainError:
    where = (
        f"GET /accounts/{user_id}/orders/{entry_id}"
        if kind in ORDER_KINDS
        else f"the balance at GET /accounts/{user_id}"
    )
    return errors.ChargeOutcomeUnknown(
        f"{why}: entry {entry_id} may or may not be made. Check {where} (or retry with the same Idempotency-Key, "
        "which answers with the first outcome) before trying again",
        entry_id=str(entry_id),
    )


@contextlib.contextmanager
def _commit_outcome_of(kind: str, user_id: int, entry_id: int) -> Iterator[None]:
    try:
        yield
    except CommitOutcomeUnknown as exc:
        raise _outcome_unknown(kind, user_id, entry_id, "the DB did not answer the commit") from exc


class _Charge:
    """An ASYNC deduct or recharge as a change Durability.apply makes durable (outbox.durable.Change): each attempt
    is one ledger_apply under a fresh entry id; an Idempotency-Key Redis does not know is looked up in the DB once,
    and the attempts after that tell the script the key was checked."""

    what = "charge"

    def __init__(
        self,
        ledger: Ledger,
        kind: str,
        user_id: int,
        amount: int,
        idem_key: str | None,
        request: str,
        grant: GrantCredit | None = None,
    ):
        self.ledger, self.store, self.grant = ledger, ledger.store, grant
        self.kind, self.user_id, self.amount, self.idem_key, self.request = kind, user_id, amount, idem_key, request
        self.key_checked, self.refusal_final = False, refusal_is_answer(idem_key)
        self.charges: dict[int, Charge] = {}  # entry id -> the charge its attempt made

    def attempt(self, entry_id: int) -> ApplyReply:
        charge = Charge(
            self.kind,
            self.user_id,
            self.amount,
            entry_id,
            int(time.time() * 1000),
            self.idem_key,
            self.request,
            self.key_checked,
            self.refusal_final,
            self.grant,
        )
        self.charges[entry_id] = charge
        reply = self.store.apply(charge)
        if reply.status is ApplyStatus.UNKNOWN_KEY:
            # Redis has no record of this key (a new key, or one Redis forgot: expired, lost, or answered on SYNC):
            # the DB keeps every answer; one read, only for keys Redis does not know
            return self._checked(charge)
        if reply.status is ApplyStatus.HELD and self.ledger.lift_rebuild_hold(self.user_id, reply.retry_at):
            # a spend of grants a rebuild held: the log is applied now and the grants reloaded, so it goes again
            return self.attempt(entry_id)
        return reply

    def _checked(self, charge: Charge) -> ApplyReply:
        """The charge of a key Redis does not know: the DB's answer for it, or the charge made with the key checked.
        An account rebuilt after a Redis loss holds such a charge (the key's first charge may still be on its way to
        the DB): once this caller sees the hold lifted, the DB holds that charge if there was one, so it asks again."""
        # only a keyed charge is answered so (the script asks only when the charge has a fingerprint)
        seen = self.store.stored_answer(self.user_id, self.idem_key) if self.idem_key is not None else None
        if seen is not None:
            return stored_reply(seen, self.request)
        self.key_checked = True
        self.charges[charge.entry_id] = replace(charge, key_checked=True)
        reply = self.store.apply(self.charges[charge.entry_id])
        if reply.status is ApplyStatus.HELD and self.ledger.lift_rebuild_hold(self.user_id, reply.retry_at):
            return self._checked(charge)
        return reply

    def reload(self) -> None:
        self.ledger.load_cache(self.user_id)

    def refusal(self, reply: ApplyReply) -> errors.DomainError | None:
        error = refusal(reply)
        if error is not None and refusal_is_answer(self.idem_key) and reply.status in BUSINESS_REFUSALS:
            # the refusal is the key's answer for good: kept in the DB (Redis recorded it too) before it is given
            self.store.remember_refusal(self.user_id, self.idem_key, self.request, refusal_answer(reply))
        return error

    def outbound(self, entry_id: int, reply: ApplyReply) -> Outbound | None:
        if reply.status is not ApplyStatus.OK:
            return None
        user_id, kind, idem_key = self.user_id, self.kind, self.idem_key
        entry = Entry(
            entry_id,
            user_id,
            self.amount,
            self.charges[entry_id].ts,
            reply.balance,
            reply.version,
            kind,
            reply.epoch,
            reply.open_flag,
            idem_key,
            grant=reply.grant or None,
        )
        return Outbound(
            str(user_id),
            entry.event,
            lambda: self.ledger._undo(user_id, entry_id, kind, idem_key),
            made_durable=(lambda: self.store.post(user_id, entry_id)) if KINDS[kind].waits_for_durable else None,
        )

    def unknown(self, entry_id: int, why: str) -> errors.DomainError:
        return _outcome_unknown(self.kind, self.user_id, entry_id, why)


class Ledger:
    """`lock`: the per-account distributed lock (hold(name) yields a hold with a fencing token), taken around every
    DB write of an account; `next_id`: ids of SYNC entries and of cache loads (ASYNC entries take theirs from
    `durability`); `hold`, `rebuild_hold_ms`: the hold of an account rebuilt after a Redis loss (load_cache)."""

    def __init__(
        self,
        store: LedgerStore,
        durability: Durability,
        lock: DistributedLock,
        next_id: Callable[[], int],
        hold: LogHold,
        rebuild_hold_ms: int,
    ):
        self.store, self.durability, self.lock, self.next_id = store, durability, lock, next_id
        self.hold, self.rebuild_hold_ms = hold, rebuild_hold_ms
        self.sync_accounts: set[int] = set()  # accounts this process last charged SYNC (charge)

    # accounts -------------------------------------------------------------------------------
    def create_account(self, user_name: str, deduct_type: str, threshold: int, currency: str | None = None) -> int:
        user_id = self.store.create_account(user_name, deduct_type, threshold, currency)
        # a DB restored or reset while Redis kept its keys hands out ids Redis still knows: the new account must not
        # inherit a cached balance or pending entries of an account that no longer exists
        self.store.forget_account(user_id)
        self.load_cache(user_id, after_loss=False)  # cached from the start: a later load is a rebuild
        return user_id

    def pending_entries(self, user_id: int) -> list[Entry]:
        """The account's entries charged in Redis and not in the DB yet (none for a SYNC account)."""
        return self.store.pending_entries(user_id)

    def account_row(self, user_id: int) -> AccountRow | None:
        """The account as the DB holds it (an operator's close is there first), None when there is none."""
        return self.store.account(user_id)

    def account_exists(self, user_id: int) -> bool:
        return self.store.is_cached(user_id) or self.store.user_exists(user_id)

    def get_account(self, user_id: int) -> Account:
        row = self.store.account(user_id)
        if row is None:
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        pending = self.store.pending_count(user_id)
        balance, version, threshold, flag, held = row.balance, row.version, row.threshold, row.open_flag, 0
        on_hold = self.store.live_on_hold_in_db(row)
        if row.deduct_type == "ASYNC":  # Redis is authoritative: the DB lags by the pending entries
            cached = self.store.cached(user_id)
            if cached is None:
                self.load_cache(user_id)
                cached = self.store.cached(user_id)
            if cached is not None:
                balance, version, threshold, flag, held, on_hold = (
                    cached.balance,
                    cached.version,
                    cached.threshold,
                    cached.open_flag,
                    cached.held,
                    cached.on_hold,
                )
        grants = self.store.cached_grants(user_id) if row.deduct_type == "ASYNC" else self.store.grants_in_db(user_id)
        now = int(time.time() * 1000)
        live = sorted((g for g in grants if g.live(now) and g.remaining > 0), key=lambda g: (g.expires_at, g.grant_id))
        return Account(
            user_id,
            row.user_name,
            balance,
            version,
            threshold,
            row.deduct_type,
            flag == "1",
            pending,
            held,
            on_hold,
            tuple(live),
            expired_remaining(grants, now),
        )

    def patch_account(
        self, user_id: int, deduct_type: str | None, threshold: int | None, api_open: bool | None
    ) -> Account:
        with self.lock.hold(keys.account_lock(user_id)) as held:
            cache_ahead = False  # the cache holds the operator's flag before the DB committed it
            try:
                with self.store.transaction() as tx:
                    locked = self._locked_account(tx, user_id, held)
                    current_type = locked.deduct_type
                    cached_fields: dict[str, int | str] = {}
                    if deduct_type == "SYNC" and current_type == "ASYNC":
                        switch = self.store.switch_to_sync(user_id)
                        if switch.status is ToSyncStatus.PENDING:
                            raise errors.PendingOrders(
                                f"{switch.pending} orders are not in the DB yet; switch to SYNC once pending_orders is 0"
                            )
                    if deduct_type is not None:
                        tx.set_deduct_type(user_id, deduct_type)
                    if threshold is not None:
                        tx.set_threshold(user_id, threshold)
                        cached_fields["threshold"] = threshold
                    if api_open is not None:
                        # The operator's change takes a version above every entry charged before it (in Redis and in
                        # the DB), so the writer never takes such an entry's open flag over it (it takes a flag only
                        # from an entry newer than the DB's version). Set in Redis first, inside this transaction:
                        # an entry charged after it carries the new flag.
                        flag = "1" if api_open else "ADMIN"
                        tx.set_open(user_id, flag)
                        cache_ahead = True
                        version = self.store.set_cached_open(user_id, flag, locked.version)
                        if version is None:  # not cached: above the entries Redis still holds for the DB too
                            version = (
                                max([locked.version, *(e.version for e in self.store.pending_entries(user_id))]) + 1
                            )
                        tx.raise_version(user_id, version)
            except Exception:
                if cache_ahead:  # the DB did not take it: drop the cache, the next read reloads it from the DB
                    with contextlib.suppress(RedisUnavailable):
                        self.store.drop_cache(user_id)
                raise
            if deduct_type == "ASYNC" and current_type == "SYNC":
                self.store.drop_cache(user_id)  # reloaded from the DB, now authoritative there
                # no charge is on its way: the switch to SYNC waited until none was pending
                self.load_cache(user_id, after_loss=False)
            elif cached_fields:
                self.store.update_cache(user_id, cached_fields)
        return self.get_account(user_id)

    def load_cache(self, user_id: int, after_loss: bool = True) -> None:
        """Cache the account from the DB (create-if-absent) under the account lock. The cached balance and holds
        also count the changes made in Redis that the DB does not hold yet.

        A cached account leaves Redis only when Redis loses it (or an operator's change failed half way), so a load
        `after_loss` is a rebuild: charges acknowledged before the loss may still be on their way to the DB, and
        a retry of one under its Idempotency-Key, which neither Redis nor the DB knows then, would be charged again
        under a new id. So a rebuild holds charges under keys Redis does not know (RECOVERING) while something of the
        account's own may still be on its way to the DB: its records the writer has not applied, or a publish in
        flight when its Redis node restarted (outbox/log_hold.py rebuild_hold). Any other cache miss (an eviction,
        an account imported into the DB) answers at once. With the Redis Streams transport there is no log outside
        Redis, and nothing to wait for."""
        hold_until, hold_log = 0, ""
        if after_loss and self.hold.enabled:
            hold_until, hold_log = self.hold.rebuild_hold(
                str(user_id), self.store.node_started_at(user_id), self.rebuild_hold_ms, int(time.time() * 1000)
            )
        with self.lock.hold(keys.account_lock(user_id)) as held, self.store.transaction() as tx:
            account = self._locked_account(tx, user_id, held)
            balance, flag, pending, in_flight = expected_cache(tx, self.store, account)
            holds = holds_with_pending(tx.active_holds(user_id), pending)
            self.store.cache_account(
                replace(account, open_flag=flag),
                balance,
                epoch=str(self.next_id()),
                holds={h.hold_id: (h.record(), h.expires_at, h.amount - h.captured) for h in holds},
                hold_until=hold_until,
                hold_log=hold_log,
                in_flight=in_flight,
                grants=grants_with_pending(
                    tx.active_grants(user_id), [e for e in pending if e.entry_id in in_flight], tx.booked_spends
                ),
            )

    def lift_rebuild_hold(self, user_id: int, retry_at: int) -> bool:
        """A caller a script answered 'held' (retry_at: the script's clock + 1 s) checks whether the writer applied
        what the log held of the account at its rebuild. True once it has: the account is then loaded again from the
        DB, which holds every change acknowledged before the loss now (a hold captured or ended, the balance)."""
        if not self.hold.passed(self.store.hold_key(user_id), retry_at - HOLD_CHECK_MS):
            return False
        with self.lock.hold(keys.account_lock(user_id)):
            self.store.drop_cache(user_id)
        self.load_cache(user_id, after_loss=False)
        return True

    @staticmethod
    def _locked_account(tx: LedgerTx, user_id: int, held: Holding) -> AccountRow:
        account = tx.lock_account(user_id, held.fence, held.owner)
        if account is None:
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        return account

    # charges ------------------------------------------------------------------------------------
    def deduct(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult:
        return self.charge(KIND_DEDUCT, user_id, amount, idem_key)

    def recharge(
        self, user_id: int, amount: int, idem_key: str | None = None, grant: GrantCredit | None = None
    ) -> LedgerResult:
        """grant: the credit is a grant (grants/), spent before the plain balance and ended at its expires_at."""
        if (
            grant is not None
            and grant.expires_at <= int(time.time() * 1000)
            and (idem_key is None or self.charged_with(KIND_RECHARGE, user_id, idem_key) is None)
        ):  # the check is a new request's: a retry under its key is answered as its first try was
            raise errors.InvalidGrant("grant.expires_at: epoch milliseconds in the future are required")
        return self.charge(KIND_RECHARGE, user_id, amount, idem_key, grant)

    def charge(
        self, kind: str, user_id: int, amount: int, idem_key: str | None, grant: GrantCredit | None = None
    ) -> LedgerResult:
        """A change of an applied kind (ledger/kinds.py): in Redis on an ASYNC account, in the DB on a SYNC one."""
        if not 0 < amount <= MAX_MINOR:
            raise errors.DomainError("amount out of range")
        idem_key = stored_key(idem_key)  # a client's key in its own namespace; a ServiceKey as it is
        request = fingerprint(kind, user_id, amount, None if grant is None else grant.field()) if idem_key else ""
        if user_id in self.sync_accounts:
            # charged SYNC before: straight to the DB, without the script call that would say SYNC again. Only a hint:
            # the mode that decides is the one read under the row lock, and ASYNC there sends the charge the Redis way
            result = self._charge_in_db(kind, user_id, amount, idem_key, request, grant, cache_said_sync=False)
            if result is not None:
                return result
            self.sync_accounts.discard(user_id)
        for _ in range(LOAD_ATTEMPTS):
            entry_id, reply = self.durability.apply(_Charge(self, kind, user_id, amount, idem_key, request, grant))
            if reply.status is ApplyStatus.SYNC:
                if len(self.sync_accounts) >= SYNC_ACCOUNTS_REMEMBERED:
                    self.sync_accounts.clear()
                self.sync_accounts.add(user_id)
                result = self._charge_in_db(kind, user_id, amount, idem_key, request, grant, cache_said_sync=True)
                if result is not None:
                    return result
                self.sync_accounts.discard(user_id)
                continue  # the DB says ASYNC after all: the stale cache was dropped, charge in Redis
            if reply.status is ApplyStatus.REPLAY:
                # a replay answers an Idempotency-Key: only a keyed charge is answered so
                if (
                    not reply.done
                    and idem_key is not None
                    and not self._publish_stale(user_id, reply.entry_id, idem_key)
                ):
                    continue  # the key's charge was rolled back for good (and is now given back): charge afresh
                return LedgerResult(reply.entry_id, user_id, amount, reply.balance, reply.version, reply.mode)
            if idem_key and not self.durability.streamed:
                with contextlib.suppress(
                    RedisUnavailable
                ):  # the charge is durable: a retry replays it once the record is stale
                    self.store.mark_answer_done(user_id, idem_key)
            return LedgerResult(entry_id, user_id, amount, reply.balance, reply.version, "ASYNC")
        raise errors.ServiceUnavailable(f"account {user_id} could not be loaded into the cache; retry")

    def change_in_db(
        self,
        user_id: int,
        entry_id: int,
        decide: Callable[[LedgerTx, AccountRow, int], LedgerEvent],
        record: Callable[[Cursor, list[LedgerEvent]], None],
    ) -> LedgerEvent | None:
        """The SYNC path of another feature's change (a hold's, a refund), as a SYNC charge: under the account lock and
        row lock, decide(tx, account, now_ms) checks the feature's rules on the DB's account and returns the change (or
        raises its refusal); the change is booked with the account's next seq, record(cursor, [change]) writes the
        feature's rows, the account row moves, all in one transaction. None when the account is ASYNC after all (the
        stale cache is dropped: the caller goes the Redis way)."""
        with (
            self.lock.hold(keys.account_lock(user_id)) as held,
            _commit_outcome_of("change", user_id, entry_id),
            self.store.transaction() as tx,
        ):
            account = self._locked_account(tx, user_id, held)
            if account.deduct_type != "SYNC":
                self.store.drop_cache(user_id)
                return None
            now = int(time.time() * 1000)
            change = decide(tx, account, now)
            (booked,), heads = book([change], {user_id: account.head}, now)
            record(tx.cursor, [change])
            tx.book_change(account, booked, heads[user_id], change.open)
        return change  # the cache is left as it is: a SYNC account's cache serves only its mode (_charge_in_db)

    def take_back(self, user_id: int, entry_id: int, kind: str) -> bool:
        """Take back a change of another feature on this account (a hold's) whose event was not acknowledged, as a
        charge is (_undo); True when it stands instead."""
        return self.store.take_back(user_id, entry_id, kind, None)

    def post(self, user_id: int, entry_id: int) -> bool:
        """The change's event is durable: release what waited for it (ledger_post)."""
        return self.store.post(user_id, entry_id)

    def _undo(self, user_id: int, entry_id: int, kind: str, idem_key: str | None) -> bool:
        """Take back a charge whose event the broker did not acknowledge; True when it stands instead.
        The DB decides first, under the account row lock the writer persists under (record_rollback): persisted
        already, the charge stands; otherwise it is recorded rolled back for good, and only then given back in
        Redis. So exactly one of the API's rollback and the writer's commit wins whatever Redis lost (its fate
        keys, or all of it), and a rolled-back charge is never persisted, however late or old its event is.
        Precedent: TigerBeetle's two-phase transfers, where voiding a pending transfer and posting it are decided
        by the ledger itself, once (a post after a void fails with pending_transfer_already_voided, for good)."""
        return self.store.take_back(user_id, entry_id, kind, idem_key)

    def _publish_stale(self, user_id: int, entry_id: int, idem_key: str) -> bool:
        """The first request with this key died before the broker acknowledged its charge: publish the
        entry again if it is still pending (a duplicate is harmless). If that fails too, the reconciler
        persists the entry once it is older than RECONCILE_AGE_S. False when the DB holds the charge as rolled
        back (its request answered OUTCOME_UNKNOWN after the DB's verdict): it is given back in Redis, and the
        key is free again."""
        entry = self.store.entry(user_id, entry_id)
        if entry is None:  # persisted already
            return True
        if self.store.is_rolled_back(entry_id):
            self.store.rollback(user_id, entry_id, idem_key)
            return False
        with contextlib.suppress(NotAcknowledged):
            self.durability.send(str(user_id), entry.event())
            self.store.mark_answer_done(user_id, idem_key)
            if KINDS[entry.kind].waits_for_durable:
                self.store.post(user_id, entry_id)
        return True

    def _charge_in_db(
        self,
        kind: str,
        user_id: int,
        amount: int,
        idem_key: str | None,
        request: str,
        grant: GrantCredit | None,
        *,
        cache_said_sync: bool,
    ) -> LedgerResult | None:
        """SYNC path. Returns None when the DB says the account is ASYNC after all: then a cache that said SYNC
        (cache_said_sync) was stale and is dropped; without it the cache may be the ASYNC account's own, and stays.

        Decided by the account's row lock alone, in one transaction of two round trips (the reads, then the writes
        with COMMIT: LedgerStore.charge_transaction), without the account lock in Redis: everything the decision
        reads, the mode included, is read under the row lock, and every other writer of the account (a switch of
        mode, a hold, the writer, a cache load) takes that row lock before it reads or writes. So a switch to ASYNC
        commits wholly before this charge (which then sees ASYNC and goes the Redis way) or after it (and the cache
        it loads holds this charge).

        The cache is not updated after the commit: a SYNC account's cache serves its mode alone (the scripts answer
        `sync` from it), while its balance and version stay as its last load left them and decide nothing (every read
        and change of a SYNC account is the DB's; a switch to ASYNC reloads the cache under the row lock). So a SYNC
        charge makes no Redis call once its process knows the account SYNC."""
        entry_id = self.next_id()
        now = int(time.time() * 1000)
        with (
            _commit_outcome_of(kind, user_id, entry_id),
            self.store.charge_transaction(user_id, idem_key, now) as (seen, tx),
        ):
            account = seen.account
            if account is None:
                raise errors.AccountNotFound(f"account {user_id} does not exist")
            if seen.answer is not None:
                replayed = stored_reply(seen.answer, request)
                error = refusal(replayed)
                if error is not None:
                    raise error
                return LedgerResult(
                    replayed.entry_id, user_id, amount, replayed.balance, replayed.version, replayed.mode
                )
            if account.deduct_type != "SYNC":
                if cache_said_sync:
                    self.store.drop_cache(user_id)
                return None
            # an expired grant is never spent, as a live hold's money is not, nor a live one by a plain-only debit (a
            # transfer's): grants.rows, the scripts' rules
            out_of_reach = expired_remaining(seen.grants, now)
            if KINDS[kind].plain_only:
                out_of_reach += live_remaining(seen.grants, now)
            refused = refused_in_db(kind, amount, account, seen.live_on_hold + out_of_reach)
            if refused is not None:  # changes nothing but the key's record: its answer for good
                if refusal_is_answer(idem_key):
                    tx.remember_answer(user_id, idem_key, request, refusal_answer(refused))
            else:
                balance, flag = charged_in_db(kind, amount, account)
                version = account.version + 1
                if flag != account.open_flag:
                    tx.set_open(user_id, flag)
                change = LedgerEvent(
                    type="ledger",
                    id=entry_id,
                    kind=kind,
                    user_id=user_id,
                    amount=amount,
                    balance_after=balance,
                    version=version,
                    epoch="",
                    ts=now,
                    open=flag,
                    idem_key=idem_key,
                    grants_spent=encode_spent(spend(seen.grants, amount, now)) if KINDS[kind].spends_grants else None,
                    grant_expires_at=None if grant is None else grant.expires_at,
                    grant_category=None if grant is None else grant.category,
                )
                (booked,), _ = book([change], {user_id: account.head}, now)
                tx.insert_sync_entry(kind, entry_id, user_id, amount, balance, version, idem_key, booked, seen)
                tx.insert_grant_changes([change])
                result = LedgerResult(entry_id, user_id, amount, balance, version, "SYNC")
                if idem_key:
                    tx.remember_answer(user_id, idem_key, request, asdict(result))
        if refused is not None:  # refused_in_db answers only refusals _REFUSALS names
            raise _REFUSALS[refused.status](refused)
        return result

    # reads ----------------------------------------------------------------------------------------
    def charged_with(self, kind: str, user_id: int, idem_key: str) -> KeyedCharge | None:
        """The entry of this kind charged on this account with this Idempotency-Key, if any, whatever the age of
        the key's idempotency record. Redis first: the writer deletes the entry string only after its DB commit,
        so an entry gone from Redis between the two reads is found in the DB."""
        stored = stored_key(idem_key)
        if stored is None:  # no key (''): nothing was charged with it
            return None
        for entry in self.store.pending_entries(user_id):
            if entry.kind == kind and entry.idem_key == stored:
                return KeyedCharge(entry.entry_id, persisted=False, ts=entry.ts)
        entry_id = self.store.stored_by_key(kind, user_id, stored)
        return None if entry_id is None else KeyedCharge(entry_id, persisted=True)

    def get_deduct(self, user_id: int, entry_id: int) -> DeductEntry:
        # Redis first: the writer deletes the entry string only after its DB commit, so an entry
        # missing here is either in the DB already or never existed.
        entry = self.store.entry(user_id, entry_id)
        if entry is not None and entry.kind in ORDER_KINDS:  # a deduct, or a transfer's debit
            # the DB's verdict is final: a charge it recorded rolled back whose give-back in Redis failed is no order
            status = "ROLLED_BACK" if self.store.is_rolled_back(entry_id) else "PENDING"
            return DeductEntry(entry_id, user_id, entry.amount, entry.balance_after, status)
        stored = self.store.stored_deduct(user_id, entry_id)
        if stored is not None:
            return DeductEntry(entry_id, user_id, stored.amount, stored.balance_after, "PERSISTED")
        raise errors.OrderNotFound(f"order {entry_id} of account {user_id} does not exist")
