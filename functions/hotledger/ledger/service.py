"""Accounts, deducts and recharges.

ASYNC accounts are charged by one Lua script on Redis (balance, entry string, consistency set and
idempotency record in one step), then the event is published to Kafka and the answer is given only
after the broker acknowledged it. A failed publish is rolled back in Redis and tombstoned so the
writer never persists it. SYNC accounts are charged in one DB transaction under the account lock,
then the cached hash is brought up to date.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

import pymysql
import redis

from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal import db
from hotledger.dal.publisher import PublishFailed
from hotledger.dal.redis_store import text
from hotledger.ledger.entry import Entry, expected_cache_balance
from hotledger.ledger.store import ApplyReply, ApplyStatus, Charge, LedgerScripts
from hotledger.money import MAX_MINOR, format_minor
from hotledger.outbox.durable import LOAD_ATTEMPTS, Durability, Outbound

MAX_BALANCE = 9_000_000_000_000_000  # below 2**53: exact in Redis Lua doubles
KIND_DEDUCT, KIND_RECHARGE = "D", "R"


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Order:
    order_id: int
    user_id: int
    amount: int
    balance_after: int
    status: str


def _open_flag(api_open: int, close_reason: str | None) -> str:
    return "1" if api_open else (close_reason or "ADMIN")


def _after_change(kind: str, balance: int, open_flag: str) -> str:
    """Balance <= 0 closes the API; a recharge making it positive reopens it (not an ADMIN close)."""
    if kind == KIND_DEDUCT and balance <= 0 and open_flag == "1":
        return "BALANCE"
    if kind == KIND_RECHARGE and balance > 0 and open_flag == "BALANCE":
        return "1"
    return open_flag


def _db_open_columns(open_flag: str) -> tuple[int, str | None]:
    return (1, None) if open_flag == "1" else (0, open_flag)


def _outcome_unknown(kind: str, user_id: int, entry_id: int, why: str) -> errors.DomainError:
    where = f"GET /accounts/{user_id}/orders/{entry_id}" if kind == KIND_DEDUCT else f"the balance at GET /accounts/{user_id}"
    return errors.ChargeOutcomeUnknown(
        f"{why}: entry {entry_id} may or may not be made. Check {where} (or retry with the same Idempotency-Key, "
        "which answers with the first outcome) before trying again",
        entry_id=str(entry_id),
    )


_REFUSALS = {
    ApplyStatus.CLOSED: lambda r: errors.ApiClosed("the account's API is closed (balance exhausted or closed by an operator)"),
    ApplyStatus.INSUFFICIENT: lambda r: errors.InsufficientBalance(
        f"balance {format_minor(r.balance)} minus the amount would fall below the account threshold"),
    ApplyStatus.LIMIT: lambda r: errors.BalanceLimit("the balance would exceed the largest supported balance"),
    ApplyStatus.CONFLICT: lambda r: errors.IdempotencyKeyReused("this Idempotency-Key was used with a different request"),
    ApplyStatus.IN_PROGRESS: lambda r: errors.IdempotencyInProgress(
        "the first request with this Idempotency-Key is still in progress"),
}


def _refusal(reply: ApplyReply) -> errors.DomainError | None:
    refuse = _REFUSALS.get(reply.status)
    return refuse(reply) if refuse else None


@contextlib.contextmanager
def _commit_outcome_of(kind: str, user_id: int, entry_id: int):
    try:
        yield
    except db.CommitOutcomeUnknown as exc:
        raise _outcome_unknown(kind, user_id, entry_id, "the DB did not answer the commit") from exc


class Billing:
    def __init__(self, cfg: Settings, scripts, lock, ids, publish):
        self.cfg, self.scripts, self.lock, self.ids = cfg, scripts, lock, ids
        self.durability = Durability(cfg, publish, ids.next_id)
        # longer than any live request spends between its charge and the broker's answer or its rollback
        self.lua = LedgerScripts(scripts, self.durability.stream_flag, cfg.entry_ttl_s, cfg.idempotency_ttl_s, MAX_BALANCE,
                                 int(cfg.publish_timeout_s * 2000) + 5000)
        self.redis: redis.Redis = scripts.client

    # accounts -------------------------------------------------------------------------------
    def create_account(self, user_name: str, deduct_type: str, threshold: int) -> int:
        try:
            with db.transaction() as cur:
                # a new account holds 0.00, so its API starts closed for balance; a recharge opens it
                cur.execute(
                    "INSERT INTO t_user (user_name, api_open, close_reason, deduct_type) VALUES (%s, 0, 'BALANCE', %s)",
                    (user_name, deduct_type),
                )
                user_id = cur.lastrowid
                cur.execute(
                    "INSERT INTO t_account (user_id, balance, version, threshold) VALUES (%s, 0, 1, %s)",
                    (user_id, threshold),
                )
        except pymysql.err.IntegrityError as exc:
            raise errors.DuplicateUserName(f"user_name {user_name!r} is taken") from exc
        return user_id

    @staticmethod
    def _locked_account(cur, user_id: int, fence: int) -> tuple:
        """Lock the account row, then read it with its user row. Every path that writes both tables
        locks t_account first (the writer too), so they serialize per account and never deadlock.
        `fence` is the distributed lock's token: a smaller one than the row has seen means this caller's
        lease ran out and a newer owner wrote since, so it must not write (it is refused)."""
        cur.execute("SELECT fence FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        seen = cur.fetchone()
        if seen is not None and seen[0] > fence:
            raise errors.FencedOut("this request's hold on the account lock ran out and a newer one wrote first; "
                                   "nothing was changed, retry")
        if seen is not None and seen[0] < fence:
            cur.execute("UPDATE t_account SET fence = %s WHERE user_id = %s", (fence, user_id))
        cur.execute(
            "SELECT u.user_name, u.api_open, u.close_reason, u.deduct_type, a.balance, a.version, a.threshold"
            " FROM t_user u JOIN t_account a ON a.user_id = u.id WHERE u.id = %s",
            (user_id,),
        )
        row = cur.fetchone()
        if row is None:
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        return row

    def load_cache(self, user_id: int) -> None:
        """Cache the account from the DB (create-if-absent) under the account lock. The cached
        balance also counts entries charged in Redis that the DB does not hold yet."""
        with self.lock.hold(keys.account_lock(user_id)) as held, db.transaction() as cur:
            _, api_open, reason, deduct_type, balance, version, threshold = self._locked_account(cur, user_id, held.fence)
            balance = expected_cache_balance(cur, self.redis, user_id, balance)
            epoch = str(self.ids.next_id())
            self.scripts.ledger_load(
                keys=[keys.balance(user_id)],
                args=[balance, version, threshold, _open_flag(api_open, reason), deduct_type, epoch],
            )

    def get_account(self, user_id: int) -> Account:
        row = db.query(
            "SELECT u.user_name, u.api_open, u.close_reason, u.deduct_type, a.balance, a.version, a.threshold"
            " FROM t_user u JOIN t_account a ON a.user_id = u.id WHERE u.id = %s",
            (user_id,),
        )
        if not row:
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        user_name, api_open, reason, deduct_type, balance, version, threshold = row[0]
        pending = self.redis.zcard(keys.consistency(user_id))
        if deduct_type == "ASYNC":
            cached = self._cached(user_id)
            if cached is None:
                self.load_cache(user_id)
                cached = self._cached(user_id)
            if cached is not None:
                balance, version, threshold, open_flag = cached
                api_open = open_flag == "1"
        return Account(user_id, user_name, balance, version, threshold, deduct_type, bool(api_open), pending)

    def account_exists(self, user_id: int) -> bool:
        return bool(self.redis.exists(keys.balance(user_id))) or bool(db.query("SELECT 1 FROM t_user WHERE id = %s", (user_id,)))

    def _cached(self, user_id: int):
        balance, version, threshold, open_flag = self.redis.hmget(keys.balance(user_id), "balance", "v", "threshold", "open")
        if balance is None:
            return None
        return int(balance), int(version), int(threshold), text(open_flag)

    def patch_account(self, user_id: int, deduct_type: str | None, threshold: int | None, api_open: bool | None) -> Account:
        with self.lock.hold(keys.account_lock(user_id)) as held:
            with db.transaction() as cur:
                _, _, _, current_type, *_ = self._locked_account(cur, user_id, held.fence)
                cached_fields: list = []
                if deduct_type == "SYNC" and current_type == "ASYNC":
                    status = self.scripts.ledger_to_sync(keys=[keys.balance(user_id), keys.consistency(user_id)])
                    if text(status[0]) == "pending":
                        raise errors.PendingOrders(
                            f"{status[1]} orders are not in the DB yet; switch to SYNC once pending_orders is 0"
                        )
                if deduct_type is not None:
                    cur.execute("UPDATE t_user SET deduct_type = %s WHERE id = %s", (deduct_type, user_id))
                if threshold is not None:
                    cur.execute("UPDATE t_account SET threshold = %s WHERE user_id = %s", (threshold, user_id))
                    cached_fields += ["threshold", threshold]
                if api_open is not None:
                    flag = "1" if api_open else "ADMIN"
                    cur.execute("UPDATE t_user SET api_open = %s, close_reason = %s WHERE id = %s",
                                (*_db_open_columns(flag), user_id))
                    cached_fields += ["open", flag]
            if deduct_type == "ASYNC" and current_type == "SYNC":
                self.redis.delete(keys.balance(user_id))  # reloaded from the DB, now authoritative there
            elif cached_fields:
                self.scripts.ledger_cache_update(keys=[keys.balance(user_id)], args=["", *cached_fields])
        return self.get_account(user_id)

    # charges ------------------------------------------------------------------------------------
    def deduct(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult:
        return self._charge(KIND_DEDUCT, user_id, amount, idem_key)

    def recharge(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult:
        return self._charge(KIND_RECHARGE, user_id, amount, idem_key)

    def _charge(self, kind: str, user_id: int, amount: int, idem_key: str | None) -> LedgerResult:
        if not 0 < amount <= MAX_MINOR:
            raise errors.DomainError("amount out of range")
        fingerprint = hashlib.sha256(f"{kind}:{user_id}:{amount}".encode()).hexdigest() if idem_key else ""
        charges: dict[int, Charge] = {}

        def attempt(entry_id: int) -> ApplyReply:
            charges[entry_id] = Charge(kind, user_id, amount, entry_id, int(time.time() * 1000), idem_key, fingerprint)
            return self.lua.apply(charges[entry_id])

        def outbound(entry_id: int, reply: ApplyReply) -> Outbound | None:
            if reply.status is not ApplyStatus.OK:
                return None
            c = charges[entry_id]
            entry = Entry(entry_id, user_id, amount, c.ts, reply.balance, reply.version, kind, reply.epoch, reply.open_flag,
                          idem_key)
            return Outbound(str(user_id), lambda: entry.to_event().model_dump(),
                            lambda: self.lua.rollback(user_id, entry_id, idem_key))

        for _ in range(LOAD_ATTEMPTS):
            entry_id, reply = self.durability.apply(
                attempt, reload=lambda: self.load_cache(user_id), refusal=_refusal, outbound=outbound,
                unknown=lambda entry_id, why: _outcome_unknown(kind, user_id, entry_id, why), what="charge")
            idem = keys.idempotency(user_id, idem_key or "")
            if reply.status is ApplyStatus.SYNC:
                result = self._charge_in_db(kind, user_id, amount, idem_key, fingerprint)
                if result is not None:
                    return result
                continue  # the DB says ASYNC after all: the stale cache was dropped, charge in Redis
            if reply.status is ApplyStatus.REPLAY:
                if not reply.done:
                    self._publish_stale(user_id, reply.entry_id, idem_key, idem)
                return LedgerResult(reply.entry_id, user_id, amount, reply.balance, reply.version, "ASYNC")
            if idem_key and not self.durability.streamed:
                with contextlib.suppress(redis.RedisError):  # the charge is durable: a retry replays it once the record is stale
                    self.redis.hset(idem, "state", "done")
            return LedgerResult(entry_id, user_id, amount, reply.balance, reply.version, "ASYNC")
        raise errors.ServiceUnavailable(f"account {user_id} could not be loaded into the cache; retry")

    def _publish_stale(self, user_id: int, entry_id: int, idem_key: str, idem: str) -> None:
        """The first request with this key died before the broker acknowledged its charge: publish the
        entry again if it is still pending (a duplicate is harmless). If that fails too, the reconciler
        persists the entry once it is older than RECONCILE_AGE_S."""
        raw = self.redis.get(keys.entry(user_id, entry_id))
        if raw is None:  # persisted already
            return
        with contextlib.suppress(PublishFailed):
            self.durability.publish(str(user_id), Entry.parse(user_id, entry_id, raw).to_event().model_dump())
            self.redis.hset(idem, "state", "done")

    def _charge_in_db(self, kind: str, user_id: int, amount: int, idem_key: str | None, fingerprint: str):
        """SYNC path. Returns None when the DB says the account is ASYNC after all (cache was stale)."""
        entry_id = self.ids.next_id()
        with self.lock.hold(keys.account_lock(user_id)) as held, _commit_outcome_of(kind, user_id, entry_id):
            with db.transaction() as cur:
                if idem_key:
                    cur.execute("SELECT fingerprint, response FROM t_idempotency WHERE user_id = %s AND idem_key = %s FOR UPDATE",
                                (user_id, idem_key))
                    seen = cur.fetchone()
                    if seen is not None:
                        if seen[0] != fingerprint:
                            raise errors.IdempotencyKeyReused("this Idempotency-Key was used with a different request")
                        return LedgerResult(**json.loads(seen[1]))
                _, api_open, reason, deduct_type, balance, version, threshold = self._locked_account(cur, user_id, held.fence)
                if deduct_type != "SYNC":
                    self.redis.delete(keys.balance(user_id))
                    return None
                open_flag = _open_flag(api_open, reason)
                if kind == KIND_DEDUCT:
                    if open_flag != "1":
                        raise _refusal(ApplyReply(ApplyStatus.CLOSED))
                    if balance - amount < threshold:
                        raise _refusal(ApplyReply(ApplyStatus.INSUFFICIENT, balance=balance))
                    balance -= amount
                else:
                    if balance + amount > MAX_BALANCE:
                        raise _refusal(ApplyReply(ApplyStatus.LIMIT))
                    balance += amount
                version += 1
                new_flag = _after_change(kind, balance, open_flag)
                cur.execute("UPDATE t_account SET balance = %s, version = %s WHERE user_id = %s", (balance, version, user_id))
                if new_flag != open_flag:
                    cur.execute("UPDATE t_user SET api_open = %s, close_reason = %s WHERE id = %s",
                                (*_db_open_columns(new_flag), user_id))
                table, amount_col = ("t_order", "amount") if kind == KIND_DEDUCT else ("t_pay", "pay")
                cur.execute(
                    f"INSERT INTO {table} (id, user_id, {amount_col}, balance, version, mode, idem_key, create_time)"
                    " VALUES (%s, %s, %s, %s, %s, 'SYNC', %s, %s)",
                    (entry_id, user_id, amount, balance, version, idem_key, datetime.now(timezone.utc).replace(tzinfo=None)),
                )
                result = LedgerResult(entry_id, user_id, amount, balance, version, "SYNC")
                if idem_key:
                    cur.execute("INSERT INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES (%s, %s, %s, %s)",
                                (user_id, idem_key, fingerprint, json.dumps(asdict(result))))
            # committed: a cache left behind here is corrected by the reconciler (its version is older than the DB's)
            with contextlib.suppress(redis.RedisError):
                self.scripts.ledger_cache_update(keys=[keys.balance(user_id)], args=[version, "balance", balance, "v", version,
                                                                            "open", new_flag])
            return result

    # reads ----------------------------------------------------------------------------------------
    def get_order(self, user_id: int, order_id: int) -> Order:
        # Redis first: the writer deletes the entry string only after its DB commit, so an entry
        # missing here is either in the DB already or never existed.
        raw = self.redis.get(keys.entry(user_id, order_id))
        if raw is not None:
            entry = Entry.parse(user_id, order_id, raw)
            if entry.kind == KIND_DEDUCT:
                return Order(order_id, user_id, entry.amount, entry.balance_after, "PENDING")
        rows = db.query("SELECT amount, balance FROM t_order WHERE id = %s AND user_id = %s", (order_id, user_id))
        if rows:
            return Order(order_id, user_id, rows[0][0], rows[0][1], "PERSISTED")
        raise errors.OrderNotFound(f"order {order_id} of account {user_id} does not exist")
