"""The ledger's storage: the SQL of t_user / t_account / t_order / t_pay / t_idempotency, the account keys in
Redis (tagged {uid}: one slot per account) and one typed wrapper per ledger_*.lua script.

- The DB keeps an account's open flag in two columns (api_open, close_reason); Redis, the scripts and the events
  keep it as one flag: '1' (open), 'BALANCE' (closed by a balance <= 0) or 'ADMIN' (closed by an operator).
  open_flag / open_columns translate, nothing else reads the columns.
- Every transaction that writes an account locks its t_account row first (the writer too), so they serialize
  per account and never deadlock; LedgerTx.lock_account also checks the distributed lock's fencing token.
- Redis failures leave here as RedisUnavailable / RedisOutcomeUnknown (dal.redis_store), a duplicate user name
  as errors.DuplicateUserName.
"""
from __future__ import annotations

from typing import cast

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum

import pymysql

from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, redis_errors_translated, reply_fields, stream_flag, text
from hotledger.holds.store import Hold, active_holds, expired_on_hold
from hotledger.monitors.store import judge
from hotledger.webhooks.store import enqueue
from hotledger.ledger.entry import HOLD_KINDS, KIND_DEDUCT, KIND_RECHARGE, KIND_REFUND, Booked, Entry, LedgerHead, is_client_key
from hotledger.outbox.events import LedgerEvent

MAX_BALANCE = 9_000_000_000_000_000  # below 2**53: exact in Redis Lua doubles
# kind -> (table, amount column): where the writer keeps each booked change by its id (its ledger row is in t_entry)
ENTRY_TABLES = {KIND_DEDUCT: ("t_order", "amount"), KIND_RECHARGE: ("t_pay", "pay"), KIND_REFUND: ("t_refund", "amount"),
                **{kind: ("t_hold_change", "amount") for kind in HOLD_KINDS}}
_ACCOUNT = ("SELECT u.id, u.user_name, u.deduct_type, a.balance, a.version, a.threshold, a.seq, a.on_hold, a.booked_at,"
            " u.api_open, u.close_reason"
            " FROM t_user u JOIN t_account a ON a.user_id = u.id WHERE u.id = %s")


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
    def of(cls, row) -> AccountRow:
        user_id, user_name, deduct_type, balance, version, threshold, seq, on_hold, booked_at, api_open, reason = row
        return cls(user_id, user_name, deduct_type, balance, version, threshold, seq, on_hold, booked_at,
                   open_flag(api_open, reason))

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
    answer: dict


@dataclass(frozen=True)
class AccountMove:
    """How a batch of persisted entries moves one account: the sum of their deltas, their highest version, and
    the open flag to write (None: the DB has seen a newer change already, the flag stays)."""

    user_id: int
    delta: int
    version: int
    open_flag: str | None
    head: LedgerHead  # the account's ledger after the batch's entries (seq, on_hold and booked_at are written)


# script replies --------------------------------------------------------------------------------------------
class ApplyStatus(Enum):
    OK = "ok"
    REPLAY = "replay"
    MISSING = "missing"
    SYNC = "sync"
    UNKNOWN_KEY = "unknown_key"  # Redis has no record of the Idempotency-Key: look it up in the DB first
    CLOSED = "closed"
    INSUFFICIENT = "insufficient"
    LIMIT = "limit"
    CONFLICT = "conflict"
    IN_PROGRESS = "in_progress"
    TOO_MANY_PENDING = "too_many_pending"  # the account holds its most entries not yet in the DB: retry later
    TOO_MANY_KEYS = "too_many_keys"  # the account opened its most client keys this window: a new one waits for the next


@dataclass(frozen=True)
class ApplyReply:
    """ledger_apply.lua's answer. OK: the new entry's balance after, version, cache epoch and open flag.
    REPLAY: the first answer for the Idempotency-Key (entry_id, balance, version, the mode that charged it) and
    whether its event is known durable (`done`). CLOSED / INSUFFICIENT / LIMIT carry the balance and version the
    charge was refused at (the refusal may be the replayed first answer for its key)."""

    status: ApplyStatus
    entry_id: int = 0
    balance: int = 0
    version: int = 0
    epoch: str = ""
    open_flag: str = ""
    done: bool = False
    mode: str = "ASYNC"

    @property
    def missing(self) -> bool:
        return self.status is ApplyStatus.MISSING

    @classmethod
    def parse(cls, raw) -> ApplyReply:
        status, *rest = reply_fields(raw)
        status = ApplyStatus(status)
        if status is ApplyStatus.OK:
            return cls(status, int(rest[0]), int(rest[1]), int(rest[2]), rest[3], rest[4])
        if status is ApplyStatus.REPLAY:
            return cls(status, int(rest[0]), int(rest[1]), int(rest[2]), done=rest[3] == "done")
        if status in (ApplyStatus.CLOSED, ApplyStatus.INSUFFICIENT, ApplyStatus.LIMIT):
            return cls(status, balance=int(rest[0]), version=int(rest[1]))
        return cls(status)


@dataclass(frozen=True)
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


class RollbackStatus(Enum):
    GONE = "gone"  # nothing left to undo (rolled back or persisted already)
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class RollbackReply:
    """ledger_rollback.lua's answer; balance/version after the money went back (None when the hash was lost)."""

    status: RollbackStatus
    balance: int | None = None
    version: int | None = None

    @classmethod
    def parse(cls, raw) -> RollbackReply:
        status, *rest = reply_fields(raw)
        return cls(RollbackStatus(status), *(int(x) for x in rest))


class ToSyncStatus(Enum):
    OK = "ok"
    PENDING = "pending"


@dataclass(frozen=True)
class ToSyncReply:
    """ledger_to_sync.lua's answer: PENDING with how many entries still wait for the DB."""

    status: ToSyncStatus
    pending: int = 0

    @classmethod
    def parse(cls, raw) -> ToSyncReply:
        status, *rest = reply_fields(raw)
        return cls(ToSyncStatus(status), *(int(x) for x in rest))


class ReconcileStatus(Enum):
    OK = "ok"  # corrected
    SAME = "same"  # already right
    CHANGED = "changed"  # the cache was reloaded (or vanished, or turned SYNC) since the snapshot: next run


@dataclass(frozen=True)
class ReconcileReply:
    status: ReconcileStatus
    version: int | None = None  # the new cached version when OK

    @classmethod
    def parse(cls, raw) -> ReconcileReply:
        status, *rest = reply_fields(raw)
        return cls(ReconcileStatus(status), *(int(x) for x in rest))


@dataclass(frozen=True)
class SettleReply:
    removed: int  # entry ids dropped from the pending set
    flagged: bool  # an entry was charged from an earlier cache load: the reconciler corrects the account


def settled(raw) -> bool:
    """ledger_settle keeps a persisted entry's string as 'settled;<entry string>' for a while, as resend evidence
    for ledger_apply: it is no pending entry."""
    return text(raw).startswith("settled;")


def pending_entries(client, user_id: int) -> list[Entry]:
    """Entries in the pending set whose entry string still exists."""
    ids = [int(text(m)) for m in client.zrange(keys.pending(user_id), 0, -1)]
    if not ids:
        return []
    raws = client.mget([keys.entry(user_id, i) for i in ids])
    return [Entry.parse(user_id, i, text(raw)) for i, raw in zip(ids, raws) if raw is not None and not settled(raw)]


@redis_errors_translated
class LedgerStore:
    def __init__(self, lua: Lua, cfg: Settings):
        self.lua, self.redis, self.stream_flag = lua, lua.client, stream_flag(cfg)
        self.entry_ttl_s, self.idempotency_ttl_s = cfg.entry_ttl_s, cfg.idempotency_ttl_s
        self.max_pending, self.max_keys = cfg.max_pending_entries, cfg.max_idempotency_keys
        # longer than any live request spends between its charge and the broker's answer or its rollback
        self.idempotency_stale_ms = int(cfg.publish_timeout_s * 2000) + 5000

    # DB ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[LedgerTx]:
        with db.transaction() as cur:
            yield LedgerTx(cur)

    def create_account(self, user_name: str, deduct_type: str, threshold: int) -> int:
        """A new account holds 0, so its API starts closed for balance; a recharge opens it."""
        try:
            with db.transaction() as cur:
                cur.execute("INSERT INTO t_user (user_name, api_open, close_reason, deduct_type) VALUES (%s, %s, %s, %s)",
                            (user_name, *open_columns("BALANCE"), deduct_type))
                user_id = cur.lastrowid
                cur.execute("INSERT INTO t_account (user_id, balance, version, threshold) VALUES (%s, 0, 1, %s)",
                            (user_id, threshold))
        except pymysql.err.IntegrityError as exc:
            raise errors.DuplicateUserName(f"user_name {user_name!r} is taken") from exc
        return user_id

    def account(self, user_id: int) -> AccountRow | None:
        rows = db.query(_ACCOUNT, (user_id,))
        return AccountRow.of(rows[0]) if rows else None

    def user_exists(self, user_id: int) -> bool:
        return bool(db.query("SELECT 1 FROM t_user WHERE id = %s", (user_id,)))

    def stored_deduct(self, user_id: int, entry_id: int) -> StoredDeduct | None:
        rows = db.query("SELECT amount, balance FROM t_order WHERE id = %s AND user_id = %s", (entry_id, user_id))
        return StoredDeduct(*rows[0]) if rows else None

    def stored_by_key(self, kind: str, user_id: int, idem_key: str) -> int | None:
        """The id of the persisted entry of this kind charged with this Idempotency-Key, if any."""
        table, _ = ENTRY_TABLES[kind]
        rows = db.query(f"SELECT id FROM {table} WHERE user_id = %s AND idem_key = %s LIMIT 1", (user_id, idem_key))
        return rows[0][0] if rows else None

    def stored_answer(self, user_id: int, idem_key: str) -> IdempotentAnswer | None:
        """The first answer the DB holds for this key (no lock: asked only when Redis has no record)."""
        rows = db.query("SELECT fingerprint, response FROM t_idempotency WHERE user_id = %s AND idem_key = %s",
                        (user_id, idem_key))
        return IdempotentAnswer(rows[0][0], json.loads(rows[0][1])) if rows else None

    def remember_refusal(self, user_id: int, idem_key: str, fingerprint: str, answer: dict) -> None:
        """Keep an ASYNC refusal as the key's answer; a key that has an answer already keeps it."""
        with db.transaction() as cur:
            cur.execute("INSERT IGNORE INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES (%s, %s, %s, %s)",
                        (user_id, idem_key, fingerprint, json.dumps(answer)))

    def record_rollback(self, user_id: int, entry_id: int, kind: str) -> bool:
        """The DB's verdict on an entry whose event the broker did not acknowledge, taken under the account's row
        lock, the lock the writer persists it under: False when the entry is now rolled back for good (recorded in
        t_rolled_back, which every persister consults, so it is never persisted, whatever Redis kept and however
        late its event arrives); True when the writer persisted it first (the event did arrive: the charge stands).
        Raises db.DatabaseUnavailable (CommitOutcomeUnknown included) when no verdict is known."""
        table, _ = ENTRY_TABLES[kind]
        with db.transaction() as cur:
            cur.execute("SELECT 1 FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
            cur.execute(f"SELECT 1 FROM {table} WHERE id = %s", (entry_id,))
            if cur.fetchone() is not None:
                return True
            cur.execute("INSERT IGNORE INTO t_rolled_back (change_id, feature, owner_id) VALUES (%s, 'ledger', %s)",
                        (entry_id, user_id))
        return False

    def is_rolled_back(self, entry_id: int) -> bool:
        """Whether the entry was rolled back for good (t_rolled_back; no lock: a verdict there never changes)."""
        return bool(db.query("SELECT 1 FROM t_rolled_back WHERE change_id = %s", (entry_id,)))

    def accounts_after(self, user_id: int, limit: int) -> list[AccountBalance]:
        """The next page of accounts in id order."""
        rows = db.query("SELECT u.id, u.deduct_type, a.balance, a.version FROM t_user u JOIN t_account a ON a.user_id = u.id"
                        " WHERE u.id > %s ORDER BY u.id LIMIT %s", (user_id, limit))
        return [AccountBalance(*row) for row in rows]

    # Redis -------------------------------------------------------------------------------------------
    def cached(self, user_id: int) -> CachedAccount | None:
        fields = cast("list[bytes | None]", self.redis.hmget(keys.balance(user_id), "balance", "v", "threshold", "open",
                                                             "held", "on_hold"))
        balance, version, threshold, flag, held, on_hold = fields
        if balance is None:
            return None
        return CachedAccount(int(balance), int(version or 0), int(threshold or 0), text(flag or b""), int(held or 0),
                             self._live_on_hold(user_id, int(on_hold or 0)))

    def _live_on_hold(self, user_id: int, on_hold: int) -> int:
        """What the ACTIVE holds keep, less those past expires_at (as the scripts count it)."""
        if on_hold <= 0:
            return 0
        expired = cast("list[bytes]", self.redis.zrangebyscore(keys.hold_expiry(user_id), "-inf", int(time.time() * 1000)))
        if not expired:
            return on_hold
        records = cast("list[bytes | None]", self.redis.hmget(keys.holds(user_id), expired))
        return on_hold - sum(int(a) - int(c) for a, c, *_ in (text(r).split(";", 2) for r in records if r is not None))

    def live_on_hold_in_db(self, account: AccountRow) -> int:
        """What the account's holds keep as the DB knows them, less those past expires_at (a SYNC account's)."""
        if account.on_hold <= 0:
            return 0
        with db.transaction() as cur:
            return account.on_hold - expired_on_hold(cur, account.user_id, int(time.time() * 1000))

    def is_cached(self, user_id: int) -> bool:
        return bool(self.redis.exists(keys.balance(user_id)))

    def cached_version(self, user_id: int) -> int | None:
        version = self.redis.hget(keys.balance(user_id), "v")
        return None if version is None else int(version)

    def drop_cache(self, user_id: int) -> None:
        self.redis.delete(keys.balance(user_id))

    def forget_account(self, user_id: int) -> None:
        """Drop the cached balance and the pending set of this account id."""
        self.redis.delete(keys.balance(user_id), keys.pending(user_id))

    def pending_count(self, user_id: int) -> int:
        return self.redis.zcard(keys.pending(user_id))

    def pending_entries(self, user_id: int) -> list[Entry]:
        return pending_entries(self.redis, user_id)

    def snapshot(self, user_id: int, limit: int) -> CacheSnapshot | None:
        """The cached balance and up to `limit` pending ids, read atomically (MULTI); None when not cached."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hmget(keys.balance(user_id), "balance", "epoch", "mode")
        pipe.zrange(keys.pending(user_id), 0, limit - 1)
        pipe.zcard(keys.pending(user_id))
        (balance, epoch, mode), ids, total = pipe.execute()
        if balance is None:
            return None
        return CacheSnapshot(int(balance), text(epoch) or "", text(mode) or "", [int(text(m)) for m in ids], total)

    def still_pending(self, user_id: int, entry_ids: list[int]) -> set[int]:
        """Those of the ids that are in the account's pending set now."""
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.zscore(keys.pending(user_id), entry_id)
        return {i for i, score in zip(entry_ids, pipe.execute()) if score is not None}

    def entry(self, user_id: int, entry_id: int) -> Entry | None:
        raw = self.redis.get(keys.entry(user_id, entry_id))
        return None if raw is None or settled(raw) else Entry.parse(user_id, entry_id, text(raw))

    def entries(self, user_id: int, entry_ids: list[int]) -> tuple[list[Entry], list[int]]:
        """(the entries whose string exists, the ids whose string expired); settled ones are neither."""
        if not entry_ids:  # a cluster client refuses an MGET of no key (it has no slot to send it to)
            return [], []
        raws = self.redis.mget([keys.entry(user_id, i) for i in entry_ids])
        found = [Entry.parse(user_id, i, text(raw)) for i, raw in zip(entry_ids, raws) if raw is not None and not settled(raw)]
        return found, [i for i, raw in zip(entry_ids, raws) if raw is None]

    def forget_pending(self, user_id: int, entry_ids: list[int]) -> None:
        self.redis.zrem(keys.pending(user_id), *entry_ids)

    def mark_answer_done(self, user_id: int, idem_key: str) -> None:
        """The charge answered for this Idempotency-Key is durable: a retry replays it without publishing again."""
        self.redis.hset(keys.idempotency(user_id, idem_key), "state", "done")

    def cache_states(self, user_ids: list[int], stale_before_ms: int, limit: int) -> list[CacheState]:
        """Per account, bounded: the cached fields, the pending count, the oldest pending charge time and at most
        `limit` ids charged before `stale_before_ms` (oldest first)."""
        pipe = self.lua.pipeline()
        for user_id in user_ids:
            pipe.hmget(keys.balance(user_id), "balance", "v", "dirty")
            pipe.zcard(keys.pending(user_id))
            pipe.zrange(keys.pending(user_id), 0, 0, withscores=True)
            pipe.zrangebyscore(keys.pending(user_id), "-inf", f"({stale_before_ms}", start=0, num=limit)
        replies = pipe.execute()
        return [CacheState(None if balance is None else int(balance), None if version is None else int(version),
                           dirty is not None, count, oldest[0][1] if oldest else None, [int(text(m)) for m in stale])
                for (balance, version, dirty), count, oldest, stale in zip(*[iter(replies)] * 4)]

    # scripts -----------------------------------------------------------------------------------------
    def apply(self, c: Charge) -> ApplyReply:
        """ledger_apply.lua: charge an ASYNC account in Redis."""
        return ApplyReply.parse(self.lua.run(
            "ledger_apply",
            [keys.balance(c.user_id), keys.entry(c.user_id, c.entry_id), keys.pending(c.user_id),
             keys.idempotency(c.user_id, c.idem_key or ""), keys.account_stream(c.user_id), keys.idempotency_quota(c.user_id),
             keys.held(c.user_id), keys.holds(c.user_id), keys.hold_expiry(c.user_id)],
            [c.kind, c.amount, c.ts, c.entry_id, self.entry_ttl_s, c.fingerprint, self.idempotency_ttl_s, MAX_BALANCE,
             c.ts - self.idempotency_stale_ms, c.idem_key or "", self.stream_flag, c.user_id,
             "checked" if c.key_checked else "", "1" if c.refusal_final else "", self.max_pending,
             self.max_keys if is_client_key(c.idem_key) else ""]))

    def rollback(self, user_id: int, entry_id: int, idem_key: str | None) -> RollbackReply:
        """ledger_rollback.lua: give back in Redis a charge the DB recorded as rolled back (record_rollback)."""
        return RollbackReply.parse(self.lua.run(
            "ledger_rollback", [keys.balance(user_id), keys.entry(user_id, entry_id), keys.pending(user_id),
                                keys.fate(user_id, entry_id), keys.idempotency(user_id, idem_key or ""),
                                keys.idempotency_quota(user_id), keys.held(user_id), keys.holds(user_id),
                                keys.hold_expiry(user_id), keys.refunds(user_id)],
            [entry_id, self.entry_ttl_s, "1" if is_client_key(idem_key) else ""]))

    def take_back(self, user_id: int, entry_id: int, kind: str, idem_key: str | None) -> bool:
        """The DB's verdict first (record_rollback, under the account row lock), then, rolled back, the charge given
        back in Redis; True when it stands instead (persisted already). The API's rollback and the writer's
        settling of an entry the DB refuses both take a charge back so."""
        if self.record_rollback(user_id, entry_id, kind):
            return True
        self.rollback(user_id, entry_id, idem_key)
        return False

    def post(self, user_id: int, entry_id: int) -> bool:
        """ledger_post.lua: the entry's event is durable: release what waited for it, a credit's amount or a capture's
        inflight count (False: nothing waited)."""
        return self.lua.run("ledger_post", [keys.balance(user_id), keys.held(user_id), keys.holds(user_id)], [entry_id]) == 1

    def cache_account(self, account: AccountRow, balance: int, epoch: str, holds: dict[int, tuple[str, int, int]]) -> bool:
        """ledger_load.lua: cache the account with this balance and its ACTIVE holds (hold id -> (record, expires_at,
        what it keeps)) unless it is cached already; False when it was. `epoch` names this load: every entry charged
        from it carries it."""
        user_id = account.user_id
        return self.lua.run("ledger_load", [keys.balance(user_id), keys.held(user_id), keys.holds(user_id),
                                            keys.hold_expiry(user_id), keys.refunds(user_id)],
                            [balance, account.version, account.threshold, account.open_flag, account.deduct_type, epoch,
                             sum(kept for _, _, kept in holds.values()),
                             *(x for hold_id, (record, expires_at, _) in holds.items() for x in (hold_id, record, expires_at))]) == 1

    def update_cache(self, user_id: int, fields: dict[str, int | str], *, if_older_than: int | None = None) -> bool:
        """ledger_cache_update.lua: set fields of the cached account if it is cached (and, with if_older_than,
        only if its version is older than that); False when nothing was set."""
        args = ["" if if_older_than is None else if_older_than, *(x for item in fields.items() for x in item)]
        return self.lua.run("ledger_cache_update", [keys.balance(user_id)], args) == 1

    def set_cached_open(self, user_id: int, flag: str, db_version: int) -> int | None:
        """ledger_set_open.lua: an operator's open flag on the cached account, with a version of its own (above the
        cached and the DB version); None when the account is not cached."""
        version = self.lua.run("ledger_set_open", [keys.balance(user_id)], [flag, db_version])
        return int(version) or None

    def switch_to_sync(self, user_id: int) -> ToSyncReply:
        """ledger_to_sync.lua: mark the cached account SYNC unless entries still wait for the DB."""
        return ToSyncReply.parse(self.lua.run("ledger_to_sync", [keys.balance(user_id), keys.pending(user_id),
                                                                 keys.holds(user_id), keys.hold_expiry(user_id)], []))

    def reconcile_cache(self, user_id: int, *, epoch: str, drift: int, db_version: int) -> ReconcileReply:
        """ledger_reconcile.lua: add `drift` to the cached balance (an adjusting entry: charges made since the
        snapshot it was computed from stay counted) unless the cache was reloaded since (another epoch)."""
        return ReconcileReply.parse(self.lua.run("ledger_reconcile", [keys.balance(user_id)], [epoch, drift, db_version]))

    def settle(self, persisted: dict[int, list[LedgerEvent]]) -> dict[int, SettleReply]:
        """ledger_settle.lua per account, pipelined: drop the persisted entries from Redis, flag accounts whose
        entries were charged from an earlier cache load."""
        if not persisted:
            return {}
        pipe = self.lua.pipeline()
        for user_id, events in persisted.items():
            self.lua.run("ledger_settle",
                         [keys.pending(user_id), keys.balance(user_id), keys.held(user_id), keys.holds(user_id),
                          *(keys.entry(user_id, e.id) for e in events)],
                         [",".join(sorted({e.epoch for e in events}))], client=pipe)
        return {user_id: SettleReply(removed, flagged == 1) for user_id, (removed, flagged) in zip(persisted, pipe.execute())}


class LedgerTx:
    """One DB transaction of the ledger (LedgerStore.transaction())."""

    def __init__(self, cursor):
        self.cursor = cursor  # for the outbox's dead letters, written in the same transaction

    def lock_account(self, user_id: int, fence: int, owner: str) -> AccountRow | None:
        """Lock the account row, then read it. `fence` is the distributed lock's token, `owner` its holder: a
        smaller token than the row has seen, or the same one from another holder (handed out twice by a Redis that
        lost the last acquisition), means a newer owner wrote or may write, so this caller must not."""
        cur = self.cursor
        cur.execute("SELECT fence, fence_owner FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        seen = cur.fetchone()
        if seen is not None and (seen[0] > fence or (seen[0] == fence and seen[1] not in (None, owner))):
            raise errors.FencedOut("this request's hold on the account lock ran out and a newer one wrote first; "
                                   "nothing was changed, retry")
        if seen is not None and (seen[0] < fence or seen[1] is None):
            cur.execute("UPDATE t_account SET fence = %s, fence_owner = %s WHERE user_id = %s", (fence, owner, user_id))
        cur.execute(_ACCOUNT, (user_id,))
        row = cur.fetchone()
        return None if row is None else AccountRow.of(row)

    def lock_balance(self, user_id: int) -> tuple[int, int]:
        """Lock the account row; (balance, version)."""
        self.cursor.execute("SELECT balance, version FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        return self.cursor.fetchone()

    def lock_accounts(self, user_ids: set[int]) -> dict[int, LockedAccount]:
        """Lock the accounts in id order (no deadlock between writers); user_id -> version and ledger head of those
        that exist."""
        if not user_ids:
            return {}
        ordered = sorted(user_ids)
        self.cursor.execute(f"SELECT user_id, version, seq, balance, on_hold, booked_at FROM t_account"
                            f" WHERE user_id IN ({_ints(ordered)}) ORDER BY user_id FOR UPDATE")
        return {row[0]: LockedAccount(row[1], LedgerHead(*row[2:])) for row in self.cursor.fetchall()}

    def stored_entries(self, ids_and_kinds: list[tuple[int, str]]) -> dict[int, tuple[int, int, int]]:
        """Entry id -> (user_id, amount, version) for those of the (id, kind) pairs the DB holds
        (t_order for deducts, t_pay for recharges)."""
        found: dict[int, tuple[int, int, int]] = {}
        for table, amount_col in set(ENTRY_TABLES.values()):
            ids = [entry_id for entry_id, entry_kind in ids_and_kinds if ENTRY_TABLES[entry_kind][0] == table]
            if ids:
                self.cursor.execute(f"SELECT id, user_id, {amount_col}, version FROM {table} WHERE id IN ({_ints(ids)})")
                found.update((row[0], tuple(row[1:])) for row in self.cursor.fetchall())
        return found

    def active_holds(self, user_id: int) -> list[Hold]:
        """The account's ACTIVE holds as the DB holds them (under the row lock this transaction took)."""
        return active_holds(self.cursor, user_id)

    def live_on_hold(self, account: AccountRow, now_ms: int) -> int:
        """What the account's holds keep, less those past expires_at (as the scripts count it)."""
        return account.on_hold - expired_on_hold(self.cursor, account.user_id, now_ms) if account.on_hold > 0 else 0

    def book_change(self, account: AccountRow, booked: Booked, head: LedgerHead, open_flag: str) -> None:
        """A SYNC change of another feature (a hold's, a refund): its ledger row and the account row after it."""
        self.insert_booked([booked])
        self.cursor.execute("UPDATE t_account SET balance = %s, version = version + 1, seq = %s, on_hold = %s,"
                            " booked_at = %s WHERE user_id = %s",
                            (head.balance, head.seq, head.on_hold, head.booked_at, account.user_id))
        if open_flag != account.open_flag:
            self.set_open(account.user_id, open_flag)

    def rolled_back(self, entry_ids: list[int]) -> set[int]:
        """Those of the ids the API rolled back for good (t_rolled_back), read under the account row locks the
        caller holds: the API records a rollback under the same lock, so the two cannot both win."""
        if not entry_ids:
            return set()
        self.cursor.execute(f"SELECT change_id FROM t_rolled_back WHERE change_id IN ({_ints(entry_ids)})")
        return {row[0] for row in self.cursor.fetchall()}

    def idempotent_answer(self, user_id: int, idem_key: str) -> IdempotentAnswer | None:
        """The first answer given for this key, read under the account's row lock (taken here first), as every writer
        of an account's answers holds it: the key is not locked itself, since a locking read of a key not there yet
        locked the gap around it, and SYNC charges of other accounts inserting their keys there waited or deadlocked."""
        self.cursor.execute("SELECT 1 FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        self.cursor.execute("SELECT fingerprint, response FROM t_idempotency WHERE user_id = %s AND idem_key = %s",
                            (user_id, idem_key))
        seen = self.cursor.fetchone()
        return None if seen is None else IdempotentAnswer(seen[0], json.loads(seen[1]))

    def remember_answer(self, user_id: int, idem_key: str, fingerprint: str, answer: dict) -> None:
        self.cursor.execute("INSERT INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES (%s, %s, %s, %s)",
                            (user_id, idem_key, fingerprint, json.dumps(answer)))

    def idempotent_answers(self, pairs: list[tuple[int, str]]) -> dict[tuple[int, str], IdempotentAnswer]:
        """(user_id, idem_key) -> the answer the DB holds, for those of the pairs it holds. Read under the caller's
        account row locks, not locked itself: every writer of an account's answers but one holds its row lock first
        (the writer and the reconciler through it, the SYNC path), and that one, the API's refusal (INSERT IGNORE),
        is replaced by the writer's answer whether it lands before or after this read. Locking the keys (FOR UPDATE)
        also locked the gaps around the keys not there yet, and partition writers inserting their own accounts' keys
        into each other's gaps deadlocked (MySQL 1213), so their batches were retried."""
        if not pairs:
            return {}
        self.cursor.execute("SELECT user_id, idem_key, fingerprint, response FROM t_idempotency WHERE (user_id, idem_key)"
                            f" IN ({','.join(['(%s, %s)'] * len(pairs))})", [x for pair in pairs for x in pair])
        return {(row[0], row[1]): IdempotentAnswer(row[2], json.loads(row[3])) for row in self.cursor.fetchall()}

    def remember_answers(self, answers: list[tuple[int, str, str, dict]]) -> None:
        """(user_id, idem_key, fingerprint, answer) each, in one statement; an answer already held is replaced
        (the writer replaces only a refusal, by the charge that was made before it)."""
        if answers:
            self.cursor.execute(
                "INSERT INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES "
                + ",".join(["(%s, %s, %s, %s)"] * len(answers))
                + " ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), response = VALUES(response)",
                [x for user_id, key, fp, answer in answers for x in (user_id, key, fp, json.dumps(answer))])

    def raise_version(self, user_id: int, version: int) -> None:
        self.cursor.execute("UPDATE t_account SET version = GREATEST(version, %s) WHERE user_id = %s", (version, user_id))

    def set_balance(self, user_id: int, balance: int, version: int) -> None:
        self.cursor.execute("UPDATE t_account SET balance = %s, version = %s WHERE user_id = %s", (balance, version, user_id))

    def set_threshold(self, user_id: int, threshold: int) -> None:
        self.cursor.execute("UPDATE t_account SET threshold = %s WHERE user_id = %s", (threshold, user_id))

    def set_deduct_type(self, user_id: int, deduct_type: str) -> None:
        self.cursor.execute("UPDATE t_user SET deduct_type = %s WHERE id = %s", (deduct_type, user_id))

    def set_open(self, user_id: int, flag: str) -> None:
        self.cursor.execute("UPDATE t_user SET api_open = %s, close_reason = %s WHERE id = %s", (*open_columns(flag), user_id))

    def insert_sync_entry(self, kind: str, entry_id: int, user_id: int, amount: int, balance: int, version: int,
                          idem_key: str | None, booked: Booked) -> None:
        """A SYNC charge: its t_order / t_pay row, its ledger row, and the account's ledger head."""
        self.cursor.execute(
            _insert_entries(kind) + "(%s, %s, %s, %s, %s, 'SYNC', %s, %s)",
            (entry_id, user_id, amount, balance, version, idem_key, datetime.now(timezone.utc).replace(tzinfo=None)))
        self.insert_booked([booked])
        self.cursor.execute("UPDATE t_account SET seq = %s, booked_at = %s WHERE user_id = %s",
                            (booked.seq, booked.booked_at, user_id))

    def insert_booked(self, rows: list[Booked]) -> None:
        """Ledger rows (t_entry), one statement, with what follows from them in the same transaction: the balance
        monitors' crossings (monitors.store) and the webhook deliveries (webhooks.store). An event exists exactly when
        its change is booked."""
        enqueue(self.cursor, rows, judge(self.cursor, rows))
        if rows:
            escape = self.cursor.connection.escape
            self.cursor.execute(
                "INSERT INTO t_entry (user_id, seq, entry_id, type, amount, delta, balance_after, available_after,"
                " booked_at, charged_at, ref) VALUES "
                + ",".join("(%d,%d,%d,%s,%d,%d,%d,%d,%d,%d,%s)" % (
                    r.user_id, r.seq, r.entry_id, escape(r.type), r.amount, r.delta, r.balance_after, r.available_after,
                    r.booked_at, r.charged_at, "NULL" if r.ref is None else escape(r.ref)) for r in rows))

    def insert_events(self, events: list[LedgerEvent]) -> None:
        """ASYNC deducts and recharges, one multi-row INSERT per table (a hold's changes: holds.store)."""
        for kind in (KIND_DEDUCT, KIND_RECHARGE):
            values = [self._entry_values(e) for e in events if e.kind == kind]
            if values:
                self.cursor.execute(_insert_entries(kind) + ",".join(values))

    def _entry_values(self, e: LedgerEvent) -> str:
        # every value but the key is a validated int: formatting them directly is ~15x cheaper than the driver's
        # escaping, which matters at tens of thousands of rows per second; the key is escaped by the driver
        idem_key = "NULL" if e.idem_key is None else self.cursor.connection.escape(e.idem_key)
        return "(%d,%d,%d,%d,%d,'ASYNC',%s,FROM_UNIXTIME(%d/1000))" % (
            e.id, e.user_id, e.amount, e.balance_after, e.version, idem_key, e.ts)

    def move_accounts(self, moves: list[AccountMove]) -> None:
        """Add each move's delta to its balance and raise its version (never lower it), in one statement; then
        the open flags, one statement for all accounts (CASE on the id)."""
        if not moves:
            return
        self.cursor.execute(
            "INSERT INTO t_account (user_id, balance, version, seq, on_hold, booked_at) VALUES "
            + ",".join("(%d,%d,%d,%d,%d,%d)" % (m.user_id, m.delta, m.version, m.head.seq, m.head.on_hold, m.head.booked_at)
                       for m in moves)
            + " ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), version = GREATEST(version, VALUES(version)),"
              " seq = VALUES(seq), on_hold = VALUES(on_hold), booked_at = VALUES(booked_at)")
        flags = [(m.user_id, open_columns(m.open_flag)) for m in moves if m.open_flag is not None]
        if flags:
            cases = " ".join(["WHEN %s THEN %s"] * len(flags))
            self.cursor.execute(
                f"UPDATE t_user SET api_open = CASE id {cases} END, close_reason = CASE id {cases} END"
                f" WHERE id IN ({_marks(flags)})",
                [x for user_id, (api_open, _) in flags for x in (user_id, api_open)]
                + [x for user_id, (_, reason) in flags for x in (user_id, reason)]
                + [user_id for user_id, _ in flags])


def _insert_entries(kind: str) -> str:
    table, amount_col = ENTRY_TABLES[kind]
    return f"INSERT INTO {table} (id, user_id, {amount_col}, balance, version, mode, idem_key, create_time) VALUES "


def _marks(values: list) -> str:
    return ",".join(["%s"] * len(values))


def _ints(values) -> str:
    """An IN list of ints, formatted directly (%d refuses anything but a number): the driver's escaping of a
    thousand ids costs more than the query."""
    return ",".join(["%d" % v for v in values])
