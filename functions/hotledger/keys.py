"""Redis key layout: every key of the service is built here. Every key a script touches carries its entity's hash tag, so each script's keys land
in one Redis Cluster slot: {uid} for an account, {v<id>} for a voucher, {rp<id>} for a red packet.

With EVENT_TRANSPORT=redis-stream the scripts also XADD to an event stream, which must share the slot:
the tag is then the entity's stream shard ({s<n>}) followed by the entity, and the shard's stream is
events:{s<n>}. STREAM_SHARDS sets how many shards (streams, slots) there are.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from hotledger.config import Settings, settings


def _shards() -> int:
    cfg = settings()
    return cfg.stream_shards if cfg.event_transport == "redis-stream" else 0


def shard_of(entity: str) -> int:
    return zlib.crc32(entity.encode()) % max(1, settings().stream_shards)


def tag(entity: str) -> str:
    cfg = settings()  # not _shards(): every key of every script call is tagged here
    if cfg.event_transport == "redis-stream":
        return f"{{s{shard_of(entity)}}}:{entity}"
    return f"{{{entity}}}"


def stream(shard: int) -> str:
    return f"events:{{s{shard}}}"


def dead_stream(shard: int) -> str:
    return f"events:dead:{{s{shard}}}"


def entity_stream(entity: str) -> str:
    """The stream a script on this entity appends to ('' in Kafka mode: the key is passed but unused)."""
    return stream(shard_of(entity)) if _shards() else f"events:unused:{tag(entity)}"


# accounts ---------------------------------------------------------------------------------------------
def balance(user_id: int) -> str:
    return f"user:balance:{tag(str(user_id))}"


def currency(user_id: int) -> str:
    """The account's ISO 4217 currency ('' for DEFAULT_CURRENCY): fixed at creation, a copy of t_account.currency."""
    return f"user:currency:{tag(str(user_id))}"


def entry(user_id: int, entry_id: int) -> str:
    """A change of the account not yet persisted: 'amount;ts;balanceAfter;version;kind;epoch;open;idemKey', and for a
    hold's change (kind H, C, V or X) ';holdId;released;expiresAt;availableAfter;stateAfter' after it."""
    return f"user:order:{tag(str(user_id))}:{entry_id}"


def pending(user_id: int) -> str:
    """Zset of entry ids charged in Redis and not yet in the DB, scored by time (ms): the account's pending set, as
    vouchers and red packets have theirs. The key keeps its first name: deployed caches hold pending entries under it."""
    return f"user:order:consistency:{tag(str(user_id))}"


def held(user_id: int) -> str:
    """Hash: entry id -> amount of each credit not durable yet (held: in the balance, not spendable)."""
    return f"user:held:{tag(str(user_id))}"


def holds(user_id: int) -> str:
    """Hash: hold id -> 'amount;captured;state;expiresAt;createdAt;description' of the account's holds Redis knows
    (a terminal one until its last entry is in the DB), and '<hold id>:inflight' -> captures of the hold whose events
    are not durable yet (no void, expiry or final capture until they are)."""
    return f"user:holds:{tag(str(user_id))}"


def hold_expiry(user_id: int) -> str:
    """Zset of the account's ACTIVE hold ids, scored by expires_at (ms)."""
    return f"user:holds:expiry:{tag(str(user_id))}"


def grants(user_id: int) -> str:
    """Hash: grant id -> 'remaining;expiresAt;category' of the account's credit grants (layers/lua/lib/grants.lua)."""
    return f"user:grants:{tag(str(user_id))}"


def grant_expiry(user_id: int) -> str:
    """Zset of the account's grant ids, scored by expires_at (ms)."""
    return f"user:grants:expiry:{tag(str(user_id))}"


def refunds(user_id: int) -> str:
    """Hash: charge id (a deduct's order id or a hold's id) -> what was refunded of it so far."""
    return f"user:refunds:{tag(str(user_id))}"


def fate(user_id: int, entry_id: int) -> str:
    """'claimed' by the writer or 'rolledback' by the API: whichever comes first wins."""
    return f"user:order:fate:{tag(str(user_id))}:{entry_id}"


def idempotency(user_id: int, idem_key: str) -> str:
    return f"user:idem:{tag(str(user_id))}:{idem_key}"


def idempotency_quota(user_id: int) -> str:
    """How many client Idempotency-Key records of deducts and recharges the account opened this window."""
    return f"user:idem:quota:{tag(str(user_id))}"


def account_lock(user_id: int) -> str:
    """The name of an account's distributed lock (dal/lock.py builds its keys from it)."""
    return f"account-{user_id}"


def account_stream(user_id: int) -> str:
    return entity_stream(str(user_id))


class AccountKeys(NamedTuple):
    """The keys of an account that name no entry or Idempotency-Key (ledger_apply's, but the entry's and the key's)."""

    balance: str
    pending: str
    stream: str
    idempotency_quota: str
    held: str
    holds: str
    hold_expiry: str
    grants: str
    grant_expiry: str


ACCOUNT_KEYS_KEPT = 10_000
# (the settings they were built under, user id -> the account's keys): every charge names nine of them, each tagged
_account_keys: tuple[Settings | None, dict[int, AccountKeys]] = (None, {})


def account_keys(user_id: int) -> AccountKeys:
    """The account's keys, built once per account while the settings stay (at most ACCOUNT_KEYS_KEPT accounts' at a
    time: a container charging more starts over)."""
    global _account_keys
    cfg, kept = _account_keys
    if cfg is not settings():  # settings() is one object per process until it is built again (runtime.reset)
        kept = {}
        _account_keys = (settings(), kept)
    found = kept.get(user_id)
    if found is None:
        if len(kept) >= ACCOUNT_KEYS_KEPT:
            kept.clear()
        found = kept[user_id] = AccountKeys(
            balance(user_id),
            pending(user_id),
            account_stream(user_id),
            idempotency_quota(user_id),
            held(user_id),
            holds(user_id),
            hold_expiry(user_id),
            grants(user_id),
            grant_expiry(user_id),
        )
    return found


# vouchers (flash sale) ------------------------------------------------------------------------------------
# A voucher sells from stock buckets 0..stock_shards-1, each its own slot: bucket 0 is tagged {v<id>} (a voucher of one
# bucket keeps the keys it always had), bucket k > 0 {v<id>:b<k>}.
def voucher_entity(voucher_id: int, bucket: int = 0) -> str:
    """The bucket's hash-tag entity; also its events' partition key."""
    return f"v{voucher_id}:b{bucket}" if bucket else f"v{voucher_id}"


def voucher(voucher_id: int, bucket: int = 0) -> str:
    """Hash: stock, begin, end, limit, epoch, hold_until, db_version, hold_log, dry:<k> (bucket k seen empty until)."""
    return f"voucher:{tag(voucher_entity(voucher_id, bucket))}"


def voucher_buyers(voucher_id: int, bucket: int = 0) -> str:
    """Hash: user id -> orders taken, for the buyers whose home is this bucket."""
    return f"voucher:buyers:{tag(voucher_entity(voucher_id, bucket))}"


def voucher_pending(voucher_id: int, bucket: int = 0) -> str:
    """Hash: order id -> 'user;seq;ts;epoch;home' for orders of this bucket's units not yet in the DB."""
    return f"voucher:pending:{tag(voucher_entity(voucher_id, bucket))}"


def voucher_away(voucher_id: int, bucket: int = 0) -> str:
    """Hash: order id -> 'user;seq;ts' for buyers of this home bucket whose unit is taken from another bucket, until
    the writer persisted the order (or it is given back)."""
    return f"voucher:away:{tag(voucher_entity(voucher_id, bucket))}"


def voucher_fate(voucher_id: int, order_id: int, bucket: int = 0) -> str:
    """'claimed' by the writer or 'rolledback' by the API: whichever comes first wins."""
    return f"voucher:fate:{tag(voucher_entity(voucher_id, bucket))}:{order_id}"


def voucher_stream(voucher_id: int, bucket: int = 0) -> str:
    return entity_stream(voucher_entity(voucher_id, bucket))


# red packets ------------------------------------------------------------------------------------------------
def packet(packet_id: int) -> str:
    """Hash: state, expires_at, hold_until."""
    return f"rp:packet:{tag(f'rp{packet_id}')}"


def packet_unclaimed(packet_id: int) -> str:
    """List of 'item_id;amount' not grabbed yet."""
    return f"rp:unclaimed:{tag(f'rp{packet_id}')}"


def packet_grabbers(packet_id: int) -> str:
    """Hash: user id -> 'item_id;amount;ts'."""
    return f"rp:grabbers:{tag(f'rp{packet_id}')}"


def packet_pending(packet_id: int) -> str:
    """Hash: item id -> 'user;amount;ts;grab id' for grabs whose claim is not in the DB yet."""
    return f"rp:pending:{tag(f'rp{packet_id}')}"


def packet_fate(packet_id: int, grab_id: int) -> str:
    """Per grab, not per item: a rolled-back item is handed out again, and its next grab must not inherit
    the first one's 'rolledback' verdict."""
    return f"rp:fate:{tag(f'rp{packet_id}')}:{grab_id}"


def packet_stream(packet_id: int) -> str:
    return entity_stream(f"rp{packet_id}")


# app inbox -------------------------------------------------------------------------------------------------
def inbox_index(account: int) -> str:
    """Zset: message id -> created (epoch ms)."""
    return f"inbox:index:{tag(f'inbox{account}')}"


def inbox_message(account: int, message_id: str) -> str:
    return f"inbox:msg:{tag(f'inbox{account}')}:{message_id}"


def inbox_biz(account: int, biz_type: str, outer_biz_id: str) -> str:
    """The message id written for one business event: makes posting idempotent. biz_type is length-prefixed, so
    the key names one (biz_type, outer_biz_id) pair: ("a:b", "c") and ("a", "b:c") are two keys (3:a:b:c, 1:a:b:c),
    where joining with ':' alone made them one."""
    return f"inbox:biz:{tag(f'inbox{account}')}:{len(biz_type)}:{biz_type}:{outer_biz_id}"


# unfinished-business journeys -----------------------------------------------------------------------------
def journeys(biz: str) -> str:
    """Zset: account -> when its journey started (epoch ms)."""
    return f"journey:{tag(f'journey-{biz}')}"


# the delay queue (dal/delay_queue.py): a client's queue is its own slot, tagged by its name --------------------
def delay_due(queue: str) -> str:
    """Zset: element -> when it is due (epoch ms)."""
    return f"dq:due:{{{queue}}}"


def delay_taken(queue: str) -> str:
    """Zset: taken element -> its visibility deadline (epoch ms)."""
    return f"dq:taken:{{{queue}}}"


def delay_channel(queue: str) -> str:
    """Pub/sub channel: an offer earlier than the queue's earliest due time wakes the drainers."""
    return f"dq:earliest:{{{queue}}}"


def delay_receipts(queue: str) -> str:
    """Hash: taken element -> its current delivery's sequence number (its receipt)."""
    return f"dq:receipt:{{{queue}}}"


def delay_deliveries(queue: str) -> str:
    """Hash: element -> how often it was delivered."""
    return f"dq:deliveries:{{{queue}}}"


def delay_seq(queue: str) -> str:
    """String: the last delivery sequence handed out."""
    return f"dq:seq:{{{queue}}}"


def delay_dead(queue: str) -> str:
    """Zset: element -> when it was dead-lettered."""
    return f"dq:dead:{{{queue}}}"


def delay_offer_keys(queue: str) -> list[str]:
    """delay_offer.lua's KEYS (for callers that pipeline the script themselves)."""
    return [delay_due(queue), delay_channel(queue), delay_taken(queue), delay_deliveries(queue), delay_dead(queue)]


# the fenced lock (dal/lock.py): a lock is its own slot, tagged by its name --------------------------------------
def lock(name: str) -> str:
    """Hash: owner -> hold count (reentrant), '#fence' -> the holder's token; the lease is the key's TTL."""
    return f"lock:{{{name}}}"


def lock_fence(name: str) -> str:
    """String: the last fencing token given for the lock."""
    return f"lock:fence:{{{name}}}"


def lock_channel(name: str) -> str:
    """Pub/sub channel: the lock was released (waiters try again)."""
    return f"lock:released:{{{name}}}"


def lock_waiters(name: str) -> str:
    """Zset: waiting owner -> until when it counts as waiting (epoch ms); a release wakes one of them, not all."""
    return f"lock:waiters:{{{name}}}"


# the scheduled reconciler -------------------------------------------------------------------------------------
def reconcile_cursor(part: str) -> str:
    """String: the id a reconciler part stopped at; its next run continues after it."""
    return f"reconcile:cursor:{tag(f'reconcile-{part}')}"


def reconcile_runs() -> str:
    """Hash: part -> its last run as JSON (when, how long, failed or not, what it found), for operators."""
    return "reconcile:runs:{reconcile}"


# the worker-id leases and their counter: global, so one home slot ({idgen}) on a cluster
IDGEN_WORKER_PREFIX = "idgen:{idgen}:worker:"
