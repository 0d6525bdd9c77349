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

import contextlib
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import pymysql
import redis

from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, node_started_at_ms, redis_errors_translated, scripts_only, stream_flag, text
from hotledger.grants.rows import Grant
from hotledger.grants.tx import active_grants
from hotledger.holds.tx import expired_on_hold
from hotledger.ledger.entry import (
    Entry,
    is_client_key,
)
from hotledger.ledger.kinds import ENTRY_TABLES
from hotledger.ledger.replies import ApplyReply, ReconcileReply, RollbackReply, SettleReply, ToSyncReply, settled
from hotledger.ledger.rows import (
    MAX_BALANCE,
    AccountBalance,
    AccountRow,
    CachedAccount,
    CacheSnapshot,
    CacheState,
    Charge,
    IdempotentAnswer,
    StoredDeduct,
    open_columns,
)
from hotledger.ledger.tx import ACCOUNT_SELECT, BookingReads, ChargeReads, LedgerTx, OnBooked
from hotledger.outbox.events import LedgerEvent


def member_ids(members: Iterable[object]) -> list[int]:
    """A ZRANGE reply read without scores (entry ids) as ints; redis-py types the reply of both ZRANGE forms alike."""
    ids = []
    for m in members:
        if not isinstance(m, (bytes, str)):
            raise TypeError(f"a sorted set member was expected, not {m!r}")
        ids.append(int(text(m)))
    return ids


def pending_entries(client: redis.Redis | redis.RedisCluster, user_id: int) -> list[Entry]:
    """Entries in the pending set whose entry string still exists."""
    ids = member_ids(client.zrange(keys.pending(user_id), 0, -1))
    if not ids:
        return []
    raws = client.mget([keys.entry(user_id, i) for i in ids])
    return [
        Entry.parse(user_id, i, text(raw))
        for i, raw in zip(ids, raws, strict=True)
        if raw is not None and not settled(raw)
    ]


@redis_errors_translated
class LedgerStore:
    def __init__(self, lua: Lua, cfg: Settings, on_booked: OnBooked, booking_reads: BookingReads):
        self.lua, self.redis, self.stream_flag = lua, lua.client, stream_flag(cfg)
        self.on_booked = on_booked  # who hears of each booking, in its transaction (hotledger.features)
        self.booking_reads = booking_reads  # what they read of an account's booking (a SYNC charge reads it first)
        self.entry_ttl_s, self.idempotency_ttl_s = cfg.entry_ttl_s, cfg.idempotency_ttl_s
        self.max_pending, self.max_keys = cfg.max_pending_entries, cfg.max_idempotency_keys
        # longer than any live request spends between its charge and the broker's answer or its rollback
        self.idempotency_stale_ms = int(cfg.publish_timeout_s * 2000) + 5000

    # DB ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[LedgerTx]:
        with db.transaction() as cur:
            yield LedgerTx(cur, self.on_booked)

    @contextlib.contextmanager
    def charge_transaction(
        self, user_id: int, idem_key: str | None, now_ms: int
    ) -> Iterator[tuple[ChargeReads, LedgerTx]]:
        """A SYNC charge's transaction in two round trips (db.batched_transaction): what it reads under the
        account's row lock, then its writes with COMMIT."""
        subscribers = self.booking_reads(user_id)
        statements = ChargeReads.statements(user_id, idem_key, now_ms, subscribers)
        with db.batched_transaction(statements) as (rows, batch):
            yield ChargeReads.of(rows, [name for name, _ in subscribers]), LedgerTx(batch, self.on_booked)

    def create_account(self, user_name: str, deduct_type: str, threshold: int, currency: str | None = None) -> int:
        """A new account holds 0, so its API starts closed for balance; a recharge opens it. currency: ISO 4217
        (None: the column's NULL, DEFAULT_CURRENCY)."""
        try:
            with db.transaction() as cur:
                cur.execute(
                    "INSERT INTO t_user (user_name, api_open, close_reason, deduct_type) VALUES (%s, %s, %s, %s)",
                    (user_name, *open_columns("BALANCE"), deduct_type),
                )
                user_id = int(cur.lastrowid)
                cur.execute(
                    "INSERT INTO t_account (user_id, balance, version, threshold, currency) VALUES (%s, 0, 1, %s, %s)",
                    (user_id, threshold, currency),
                )
        except pymysql.err.IntegrityError as exc:
            raise errors.DuplicateUserName(f"user_name {user_name!r} is taken") from exc
        return user_id

    def account(self, user_id: int) -> AccountRow | None:
        rows = db.query(ACCOUNT_SELECT, (user_id,))
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
        rows = db.query(
            "SELECT fingerprint, response FROM t_idempotency WHERE user_id = %s AND idem_key = %s", (user_id, idem_key)
        )
        return IdempotentAnswer(rows[0][0], json.loads(rows[0][1])) if rows else None

    def remember_refusal(self, user_id: int, idem_key: str, fingerprint: str, answer: dict[str, Any]) -> None:
        """Keep an ASYNC refusal as the key's answer; a key that has an answer already keeps it."""
        with db.transaction() as cur:
            cur.execute(
                "INSERT IGNORE INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES (%s, %s, %s, %s)",
                (user_id, idem_key, fingerprint, json.dumps(answer)),
            )

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
            cur.execute(
                "INSERT IGNORE INTO t_rolled_back (change_id, feature, owner_id) VALUES (%s, 'ledger', %s)",
                (entry_id, user_id),
            )
        return False

    def is_rolled_back(self, entry_id: int) -> bool:
        """Whether the entry was rolled back for good (t_rolled_back; no lock: a verdict there never changes)."""
        return bool(db.query("SELECT 1 FROM t_rolled_back WHERE change_id = %s", (entry_id,)))

    def accounts_after(self, user_id: int, limit: int) -> list[AccountBalance]:
        """The next page of accounts in id order."""
        rows = db.query(
            "SELECT u.id, u.deduct_type, a.balance, a.version FROM t_user u JOIN t_account a ON a.user_id = u.id"
            " WHERE u.id > %s ORDER BY u.id LIMIT %s",
            (user_id, limit),
        )
        return [AccountBalance(*row) for row in rows]

    # Redis -------------------------------------------------------------------------------------------
    def cached(self, user_id: int) -> CachedAccount | None:
        fields = cast(
            "list[bytes | None]",
            self.redis.hmget(keys.balance(user_id), "balance", "v", "threshold", "open", "held", "on_hold"),
        )
        balance, version, threshold, flag, held, on_hold = fields
        if balance is None:
            return None
        return CachedAccount(
            int(balance),
            int(version or 0),
            int(threshold or 0),
            text(flag or b""),
            int(held or 0),
            self._live_on_hold(user_id, int(on_hold or 0)),
        )

    def _live_on_hold(self, user_id: int, on_hold: int) -> int:
        """What the ACTIVE holds keep, less those past expires_at (as the scripts count it)."""
        if on_hold <= 0:
            return 0
        expired = cast(
            "list[bytes]", self.redis.zrangebyscore(keys.hold_expiry(user_id), "-inf", int(time.time() * 1000))
        )
        if not expired:
            return on_hold
        records = cast("list[bytes | None]", self.redis.hmget(keys.holds(user_id), expired))
        return on_hold - sum(int(a) - int(c) for a, c, *_ in (text(r).split(";", 2) for r in records if r is not None))

    def cached_grants(self, user_id: int) -> list[Grant]:
        """The account's credit grants as Redis keeps them (lib/grants.lua), expired or spent ones too."""
        raw = cast("dict[bytes, bytes]", self.redis.hgetall(keys.grants(user_id)))
        return [Grant.parse(int(grant_id), user_id, text(record)) for grant_id, record in raw.items()]

    def grants_in_db(self, user_id: int) -> list[Grant]:
        """The account's ACTIVE grants with something left, as the DB holds them (a SYNC account's)."""
        with db.transaction() as cur:
            return active_grants(cur, user_id)

    def live_on_hold_in_db(self, account: AccountRow) -> int:
        """What the account's holds keep as the DB knows them, less those past expires_at (a SYNC account's)."""
        if account.on_hold <= 0:
            return 0
        with db.transaction() as cur:
            return account.on_hold - expired_on_hold(cur, account.user_id, int(time.time() * 1000))

    @staticmethod
    def hold_key(user_id: int) -> str:
        """The hash a rebuild's log hold lives in (outbox/log_hold.py)."""
        return keys.balance(user_id)

    def node_started_at(self, user_id: int) -> int:
        """When the Redis node holding the account started (epoch ms): a rebuild's time hold runs from there."""
        return node_started_at_ms(self.redis, keys.balance(user_id))

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
        return {i for i, score in zip(entry_ids, pipe.execute(), strict=True) if score is not None}

    def entry(self, user_id: int, entry_id: int) -> Entry | None:
        raw = self.redis.get(keys.entry(user_id, entry_id))
        return None if raw is None or settled(raw) else Entry.parse(user_id, entry_id, text(raw))

    def entries(self, user_id: int, entry_ids: list[int]) -> tuple[list[Entry], list[int]]:
        """(the entries whose string exists, the ids whose string expired); settled ones are neither."""
        if not entry_ids:  # a cluster client refuses an MGET of no key (it has no slot to send it to)
            return [], []
        raws = self.redis.mget([keys.entry(user_id, i) for i in entry_ids])
        found = [
            Entry.parse(user_id, i, text(raw))
            for i, raw in zip(entry_ids, raws, strict=True)
            if raw is not None and not settled(raw)
        ]
        return found, [i for i, raw in zip(entry_ids, raws, strict=True) if raw is None]

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
        return [
            CacheState(
                None if balance is None else int(balance),
                None if version is None else int(version),
                dirty is not None,
                count,
                oldest[0][1] if oldest else None,
                [int(text(m)) for m in stale],
            )
            for (balance, version, dirty), count, oldest, stale in zip(*[iter(replies)] * 4, strict=True)
        ]

    # scripts -----------------------------------------------------------------------------------------
    @scripts_only
    def apply(self, c: Charge) -> ApplyReply:
        """ledger_apply.lua: charge an ASYNC account in Redis."""
        account = keys.account_keys(c.user_id)
        return ApplyReply.parse(
            self.lua.run(
                "ledger_apply",
                [
                    account.balance,
                    keys.entry(c.user_id, c.entry_id),
                    account.pending,
                    keys.idempotency(c.user_id, c.idem_key or ""),
                    account.stream,
                    account.idempotency_quota,
                    account.held,
                    account.holds,
                    account.hold_expiry,
                    account.grants,
                    account.grant_expiry,
                ],
                [
                    c.kind,
                    c.amount,
                    c.ts,
                    c.entry_id,
                    self.entry_ttl_s,
                    c.fingerprint,
                    self.idempotency_ttl_s,
                    MAX_BALANCE,
                    c.ts - self.idempotency_stale_ms,
                    c.idem_key or "",
                    self.stream_flag,
                    c.user_id,
                    "checked" if c.key_checked else "",
                    "1" if c.refusal_final else "",
                    self.max_pending,
                    self.max_keys if is_client_key(c.idem_key) else "",
                    "" if c.grant is None else c.grant.expires_at,
                    "" if c.grant is None else c.grant.category,
                ],
            )
        )

    def rollback(self, user_id: int, entry_id: int, idem_key: str | None) -> RollbackReply:
        """ledger_rollback.lua: give back in Redis a charge the DB recorded as rolled back (record_rollback)."""
        return RollbackReply.parse(
            self.lua.run(
                "ledger_rollback",
                [
                    keys.balance(user_id),
                    keys.entry(user_id, entry_id),
                    keys.pending(user_id),
                    keys.fate(user_id, entry_id),
                    keys.idempotency(user_id, idem_key or ""),
                    keys.idempotency_quota(user_id),
                    keys.held(user_id),
                    keys.holds(user_id),
                    keys.hold_expiry(user_id),
                    keys.refunds(user_id),
                    keys.grants(user_id),
                    keys.grant_expiry(user_id),
                ],
                [entry_id, self.entry_ttl_s, "1" if is_client_key(idem_key) else ""],
            )
        )

    def take_back(self, user_id: int, entry_id: int, kind: str, idem_key: str | None) -> bool:
        """The DB's verdict first (record_rollback, under the account row lock), then, rolled back, the charge given
        back in Redis; True when it stands instead (persisted already). The API's rollback and the writer's
        settling of an entry the DB refuses both take a charge back so."""
        if self.record_rollback(user_id, entry_id, kind):
            return True
        self.rollback(user_id, entry_id, idem_key)
        return False

    @scripts_only
    def post(self, user_id: int, entry_id: int) -> bool:
        """ledger_post.lua: the entry's event is durable: release what waited for it, a credit's amount or a capture's
        inflight count (False: nothing waited)."""
        account = keys.account_keys(user_id)
        return int(self.lua.run("ledger_post", [account.balance, account.held, account.holds], [entry_id])) == 1

    def cache_account(
        self,
        account: AccountRow,
        balance: int,
        epoch: str,
        holds: dict[int, tuple[str, int, int]],
        hold_until: int = 0,
        hold_log: str = "",
        in_flight: tuple[int, ...] = (),
        grants: Sequence[Grant] = (),
    ) -> bool:
        """ledger_load.lua: cache the account with this balance and its ACTIVE holds (hold id -> (record, expires_at,
        what it keeps)) unless it is cached already; False when it was. `epoch` names this load: every entry charged
        from it carries it. `in_flight`: the pending entries the DB does not hold yet, whose waits for durability
        (held credits, in-flight captures) Redis keeps. A rebuild after a Redis loss holds charges under new Idempotency-Keys until `hold_until`
        (epoch ms) and, while `hold_log` is set, until the writer applied the log (outbox/log_hold.py). `grants`: the
        account's grants with something left (expired ones too, until their expiry entry)."""
        user_id = account.user_id
        return (
            int(
                self.lua.run(
                    "ledger_load",
                    [
                        keys.balance(user_id),
                        keys.held(user_id),
                        keys.holds(user_id),
                        keys.hold_expiry(user_id),
                        keys.refunds(user_id),
                        keys.grants(user_id),
                        keys.grant_expiry(user_id),
                    ],
                    [
                        balance,
                        account.version,
                        account.threshold,
                        account.open_flag,
                        account.deduct_type,
                        epoch,
                        hold_until,
                        hold_log,
                        sum(kept for _, _, kept in holds.values()),
                        ",".join(map(str, in_flight)),
                        ",".join(f"{g.grant_id}:{g.remaining}:{g.expires_at}:{g.category}" for g in grants),
                        *(
                            x
                            for hold_id, (record, expires_at, _) in holds.items()
                            for x in (hold_id, record, expires_at)
                        ),
                    ],
                )
            )
            == 1
        )

    def update_cache(self, user_id: int, fields: dict[str, int | str]) -> bool:
        """ledger_cache_update.lua: set fields of the cached account if it is cached; False when it is not."""
        args = [x for item in fields.items() for x in item]
        return int(self.lua.run("ledger_cache_update", [keys.balance(user_id)], args)) == 1

    def set_cached_open(self, user_id: int, flag: str, db_version: int) -> int | None:
        """ledger_set_open.lua: an operator's open flag on the cached account, with a version of its own (above the
        cached and the DB version); None when the account is not cached."""
        version = self.lua.run("ledger_set_open", [keys.balance(user_id)], [flag, db_version])
        return int(version) or None

    def switch_to_sync(self, user_id: int) -> ToSyncReply:
        """ledger_to_sync.lua: mark the cached account SYNC unless entries still wait for the DB."""
        return ToSyncReply.parse(
            self.lua.run(
                "ledger_to_sync",
                [keys.balance(user_id), keys.pending(user_id), keys.holds(user_id), keys.hold_expiry(user_id)],
                [],
            )
        )

    def reconcile_cache(self, user_id: int, *, epoch: str, drift: int, db_version: int) -> ReconcileReply:
        """ledger_reconcile.lua: add `drift` to the cached balance (an adjusting entry: charges made since the
        snapshot it was computed from stay counted) unless the cache was reloaded since (another epoch)."""
        return ReconcileReply.parse(
            self.lua.run("ledger_reconcile", [keys.balance(user_id)], [epoch, drift, db_version])
        )

    def settle(self, persisted: dict[int, list[LedgerEvent]]) -> dict[int, SettleReply]:
        """ledger_settle.lua per account, pipelined: drop the persisted entries from Redis, flag accounts whose
        entries were charged from an earlier cache load."""
        if not persisted:
            return {}
        pipe = self.lua.pipeline()
        for user_id, events in persisted.items():
            self.lua.run(
                "ledger_settle",
                [
                    keys.pending(user_id),
                    keys.balance(user_id),
                    keys.held(user_id),
                    keys.holds(user_id),
                    *(keys.entry(user_id, e.id) for e in events),
                ],
                [",".join(sorted({e.epoch for e in events}))],
                client=pipe,
            )
        return {
            user_id: SettleReply(removed, flagged == 1)
            for user_id, (removed, flagged) in zip(persisted, pipe.execute(), strict=True)
        }
