"""The ledger's decisions (charges, SYNC path, accounts, writer-side persister, reconcile), driven with an in-memory
store that only keeps what it is told: the rules under test live in hotledger.ledger, never in the fakes."""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fakes import FakeOutbox
from helpers import run_event_keys, verified_fields
from hotledger import errors
from hotledger.config import Settings
from hotledger.dal.db import CommitOutcomeUnknown, DatabaseUnavailable
from hotledger.dal.publisher import NotAcknowledged
from hotledger.dal.redis_store import RedisOutcomeUnknown, RedisUnavailable
from hotledger.ledger.entry import Entry, ServiceKey, stored_key
from hotledger.ledger.persist import LedgerPersister
from hotledger.ledger.reconcile import LedgerReconcile
from hotledger.ledger.replies import (
    ApplyReply,
    ApplyStatus,
    ReconcileReply,
    ReconcileStatus,
    RollbackReply,
    RollbackStatus,
    SettleReply,
    ToSyncReply,
    ToSyncStatus,
)
from hotledger.ledger.rows import (
    MAX_BALANCE,
    AccountBalance,
    AccountRow,
    CachedAccount,
    CacheSnapshot,
    CacheState,
    IdempotentAnswer,
    LockedAccount,
    StoredDeduct,
)
from hotledger.ledger.service import Ledger, after_change, fingerprint, refusal
from hotledger.ledger.tx import ChargeReads
from hotledger.outbox.durable import Durability
from hotledger.outbox.log_hold import LogHold
from hotledger.outbox.writer import PersistReport

USER = 7


# fakes ---------------------------------------------------------------------------------------------------
class FakeLock:
    def __init__(self):
        self.fence, self.held = 0, []

    @contextlib.contextmanager
    def hold(self, name: str):
        self.fence += 1
        self.held.append(name)
        yield SimpleNamespace(fence=self.fence, owner="fake-owner")


class FakeLedgerStore:
    """LedgerStore and its LedgerTx in one: DB rows in dicts (rolled back when the transaction body raises),
    Redis as dicts, each script answering what the test queued."""

    def __init__(self):
        self.accounts: dict[int, AccountRow] = {}
        self.rows: dict[int, tuple] = {}  # entry id -> (kind, user_id, amount, version, balance after, mode, idem_key)
        self.answers: dict[tuple[int, str], IdempotentAnswer] = {}
        self.cache: dict[int, CachedAccount] = {}
        self.dirty: set[int] = set()
        self.redis_entries: dict[tuple[int, int], Entry] = {}
        self.pending: dict[int, dict[int, float]] = {}
        self.replies: list = []  # what ledger_apply answers, call by call (an exception is raised)
        self.charges, self.rollbacks, self.loads, self.updates, self.dropped, self.done = [], [], [], [], [], []
        self.rollback_reply: RollbackReply | Exception = RollbackReply(RollbackStatus.ROLLED_BACK)
        self.to_sync_reply = ToSyncReply(ToSyncStatus.OK)
        self.reconciled, self.settled, self.forgotten, self.posted = [], [], [], []
        self.commit_error: Exception | None = None
        self.cache_error: Exception | None = None
        self.cursor = object()
        self.answer_reads, self.open_sets = [], []
        self.rolled: set[int] = set()  # t_rolled_back
        self.record_error: Exception | None = None
        self.undo_steps: list[tuple[str, int]] = []
        self.booked: list = []  # t_entry

    def account_row(self, user_id=USER, **fields) -> AccountRow:
        row = AccountRow(
            user_id,
            f"u{user_id}",
            fields.pop("deduct_type", "ASYNC"),
            fields.pop("balance", 1000),
            fields.pop("version", 1),
            fields.pop("threshold", 0),
            0,
            0,
            0,
            fields.pop("open_flag", "1"),
        )
        self.accounts[user_id] = row
        return row

    def charge_in_redis(self, entry: Entry, ts: float = 0.0) -> None:
        self.redis_entries[(entry.user_id, entry.entry_id)] = entry
        self.pending.setdefault(entry.user_id, {})[entry.entry_id] = ts

    # LedgerStore: DB
    @contextlib.contextmanager
    def transaction(self):
        saved = copy.deepcopy((self.accounts, self.rows, self.answers, self.booked))
        try:
            yield self
        except BaseException:
            self.accounts, self.rows, self.answers, self.booked = saved
            raise
        if self.commit_error:
            raise self.commit_error

    @contextlib.contextmanager
    def charge_transaction(self, user_id, idem_key, now_ms):
        with self.transaction() as tx:
            answer = self.answers.get((user_id, idem_key)) if idem_key else None
            yield ChargeReads(self.accounts.get(user_id), answer, 0, self.active_grants(user_id), {}), tx

    def account(self, user_id):
        return self.accounts.get(user_id)

    def user_exists(self, user_id):
        return user_id in self.accounts

    def stored_deduct(self, user_id, entry_id):
        row = self.rows.get(entry_id)
        return StoredDeduct(row[2], row[4]) if row and row[0] == "D" and row[1] == user_id else None

    def take_back(self, user_id, entry_id, kind, idem_key):
        if self.record_rollback(user_id, entry_id, kind):
            return True
        self.rollback(user_id, entry_id, idem_key)
        return False

    def record_rollback(self, user_id, entry_id, kind):
        if self.record_error:
            raise self.record_error
        if entry_id in self.rows:
            return True
        self.rolled.add(entry_id)
        self.undo_steps.append(("record", entry_id))
        return False

    def is_rolled_back(self, entry_id):
        return entry_id in self.rolled

    def accounts_after(self, user_id, limit):
        ids = sorted(i for i in self.accounts if i > user_id)[:limit]
        return [
            AccountBalance(i, self.accounts[i].deduct_type, self.accounts[i].balance, self.accounts[i].version)
            for i in ids
        ]

    # LedgerStore: Redis
    def cached(self, user_id):
        return self.cache.get(user_id)

    def is_cached(self, user_id):
        return user_id in self.cache

    def cached_version(self, user_id):
        return self.cache[user_id].version if user_id in self.cache else None

    def drop_cache(self, user_id):
        self.dropped.append(user_id)
        self.cache.pop(user_id, None)

    def forget_account(self, user_id):
        self.cache.pop(user_id, None)
        self.pending.pop(user_id, None)

    def pending_count(self, user_id):
        return len(self.pending.get(user_id, {}))

    def pending_entries(self, user_id):
        return [
            self.redis_entries[(user_id, i)]
            for i in self.pending.get(user_id, {})
            if (user_id, i) in self.redis_entries
        ]

    def entry(self, user_id, entry_id):
        return self.redis_entries.get((user_id, entry_id))

    def entries(self, user_id, entry_ids):
        return (
            [self.redis_entries[(user_id, i)] for i in entry_ids if (user_id, i) in self.redis_entries],
            [i for i in entry_ids if (user_id, i) not in self.redis_entries],
        )

    def forget_pending(self, user_id, entry_ids):
        self.forgotten += entry_ids
        for i in entry_ids:
            self.pending[user_id].pop(i)

    def mark_answer_done(self, user_id, idem_key):
        self.done.append((user_id, idem_key))

    def stored_answer(self, user_id, idem_key):
        self.answer_reads.append((user_id, idem_key))
        return self.answers.get((user_id, idem_key))

    def remember_refusal(self, user_id, idem_key, fingerprint_, answer):
        self.answers.setdefault((user_id, idem_key), IdempotentAnswer(fingerprint_, answer))

    def cache_states(self, user_ids, stale_before_ms, limit):
        return [
            CacheState(
                c.balance if c else None,
                c.version if c else None,
                u in self.dirty,
                len(pending),
                min(pending.values(), default=None),
                sorted((i for i, ts in pending.items() if ts < stale_before_ms), key=pending.get)[:limit],
            )
            for u in user_ids
            for c, pending in [(self.cache.get(u), self.pending.get(u, {}))]
        ]

    def snapshot(self, user_id, limit):
        if user_id not in self.cache:
            return None
        ids = sorted(self.pending.get(user_id, {}), key=self.pending[user_id].get) if user_id in self.pending else []
        return CacheSnapshot(self.cache[user_id].balance, "e1", "ASYNC", ids[:limit], len(ids))

    def still_pending(self, user_id, entry_ids):
        return set(entry_ids) & set(self.pending.get(user_id, {}))

    # LedgerStore: scripts
    def apply(self, charge):
        self.charges.append(charge)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def rollback(self, user_id, entry_id, idem_key):
        self.rollbacks.append(entry_id)
        self.undo_steps.append(("give back", entry_id))
        if isinstance(self.rollback_reply, Exception):
            raise self.rollback_reply
        return self.rollback_reply

    def post(self, user_id, entry_id):
        self.posted.append(entry_id)
        return True

    def active_holds(self, user_id):
        return []

    def active_grants(self, user_id):
        return []

    def booked_spends(self, grant_ids):
        return {}

    def insert_grant_changes(self, changes):
        pass

    def cached_grants(self, user_id):
        return []

    def grants_in_db(self, user_id):
        return []

    def live_on_hold(self, account, now_ms):
        return 0

    def live_on_hold_in_db(self, account):
        return 0

    def cache_account(self, account, balance, epoch, holds, hold_until=0, hold_log="", in_flight=(), grants=()):
        self.loads.append((account.user_id, balance, epoch))
        self.cache[account.user_id] = CachedAccount(balance, account.version, account.threshold, account.open_flag)
        return True

    def update_cache(self, user_id, fields):
        if self.cache_error:
            raise self.cache_error
        self.updates.append((user_id, dict(fields)))
        return True

    def set_cached_open(self, user_id, flag, db_version):
        self.open_sets.append((user_id, flag, db_version))
        if user_id not in self.cache:
            return None
        version = max(self.cache[user_id].version, db_version) + 1
        self.cache[user_id] = replace(self.cache[user_id], version=version, open_flag=flag)
        return version

    def switch_to_sync(self, user_id):
        return self.to_sync_reply

    def reconcile_cache(self, user_id, *, epoch, drift, db_version):
        self.reconciled.append((user_id, drift, db_version))
        cached = self.cache[user_id]
        version = max(cached.version, db_version) + 1
        self.cache[user_id] = replace(cached, balance=cached.balance + drift, version=version)
        self.dirty.discard(user_id)
        return ReconcileReply(ReconcileStatus.OK, version)

    def settle(self, persisted):
        self.settled.append({u: sorted(e.id for e in events) for u, events in persisted.items()})
        return {u: SettleReply(len(events), any(e.epoch == "old" for e in events)) for u, events in persisted.items()}

    # LedgerTx
    def lock_account(self, user_id, fence, owner):
        return self.accounts.get(user_id)

    def lock_balance(self, user_id):
        return self.accounts[user_id].balance, self.accounts[user_id].version

    def lock_accounts(self, user_ids):
        return {
            u: LockedAccount(self.accounts[u].version, self.accounts[u].head) for u in user_ids if u in self.accounts
        }

    def stored_entries(self, ids_and_kinds):
        return {i: self.rows[i][1:4] for i, kind in ids_and_kinds if i in self.rows and self.rows[i][0] == kind}

    def rolled_back(self, entry_ids):
        return {i for i in entry_ids if i in self.rolled}

    def idempotent_answer(self, user_id, idem_key):
        return self.answers.get((user_id, idem_key))

    def remember_answer(self, user_id, idem_key, fingerprint_, answer):
        self.answers[(user_id, idem_key)] = IdempotentAnswer(fingerprint_, answer)

    def idempotent_answers(self, pairs):
        return {p: self.answers[p] for p in pairs if p in self.answers}

    def remember_answers(self, answers):
        for user_id, key, fingerprint_, answer in answers:
            self.answers[(user_id, key)] = IdempotentAnswer(fingerprint_, answer)

    def raise_version(self, user_id, version):
        self.accounts[user_id] = replace(self.accounts[user_id], version=max(self.accounts[user_id].version, version))

    def set_balance(self, user_id, balance, version):
        self.accounts[user_id] = replace(self.accounts[user_id], balance=balance, version=version)

    def set_threshold(self, user_id, threshold):
        self.accounts[user_id] = replace(self.accounts[user_id], threshold=threshold)

    def set_deduct_type(self, user_id, deduct_type):
        self.accounts[user_id] = replace(self.accounts[user_id], deduct_type=deduct_type)

    def set_open(self, user_id, flag):
        self.accounts[user_id] = replace(self.accounts[user_id], open_flag=flag)

    def insert_sync_entry(self, kind, entry_id, user_id, amount, balance, version, idem_key, booked, reads):
        self.rows[entry_id] = (kind, user_id, amount, version, balance, "SYNC", idem_key)
        self.insert_booked([booked])
        self.accounts[user_id] = replace(
            self.accounts[user_id], balance=balance, version=version, seq=booked.seq, booked_at=booked.booked_at
        )

    def insert_booked(self, rows):
        self.booked.extend(rows)

    def insert_events(self, events):
        for e in events:
            self.rows[e.id] = (e.kind, e.user_id, e.amount, e.version, e.balance_after, "ASYNC", e.idem_key)

    def move_accounts(self, moves):
        for m in moves:
            row = self.accounts[m.user_id]
            self.accounts[m.user_id] = replace(
                row,
                balance=row.balance + m.delta,
                version=max(row.version, m.version),
                open_flag=row.open_flag if m.open_flag is None else m.open_flag,
                seq=m.head.seq,
                on_hold=m.head.on_hold,
                booked_at=m.head.booked_at,
            )


class Ids:
    def __init__(self, start=100):
        self.last = start

    def __call__(self) -> int:
        self.last += 1
        return self.last


@pytest.fixture
def store():
    return FakeLedgerStore()


@pytest.fixture
def published():
    return []


def make_ledger(store, published, transport="kafka", publish=None):
    ids = Ids()
    durability = Durability(
        Settings(event_transport=transport),
        publish or (lambda key, value: published.append(json.loads(value))),
        ids,
        run_event_keys(),
    )
    no_rebuild_hold = LogHold(None, dict, "", streamed=True)  # the fake store keeps no rebuild hold (Lua's)
    return Ledger(store, durability, FakeLock(), ids, no_rebuild_hold, 0)


@pytest.fixture
def ledger(store, published):
    return make_ledger(store, published)


def ok(balance, version=2, epoch="e1", open_flag="1"):
    return ApplyReply(ApplyStatus.OK, 0, balance, version, epoch, open_flag)


def entry(entry_id, amount=100, kind="D", version=2, user_id=USER, epoch="e1", open_flag="1", balance_after=900):
    return Entry(entry_id, user_id, amount, 1_000, balance_after, version, kind, epoch, open_flag)


def event(entry_id, amount=100, kind="D", version=2, user_id=USER, epoch="e1", open_flag="1"):
    return entry(entry_id, amount, kind, version, user_id, epoch, open_flag).to_event()


# rules ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,balance,before,after",
    [
        ("D", 0, "1", "BALANCE"),
        ("D", -5, "1", "BALANCE"),
        ("D", 1, "1", "1"),
        ("R", 1, "BALANCE", "1"),
        ("R", 0, "BALANCE", "BALANCE"),
        ("R", 500, "ADMIN", "ADMIN"),
        ("D", 0, "ADMIN", "ADMIN"),
    ],
)
def test_the_api_closes_at_zero_or_below_and_a_recharge_reopens_only_a_balance_close(kind, balance, before, after):
    assert after_change(kind, balance, before) == after


def test_the_fingerprint_binds_kind_account_and_amount():
    base = fingerprint("D", USER, 100)
    assert base == fingerprint("D", USER, 100)
    assert len({base, fingerprint("R", USER, 100), fingerprint("D", USER + 1, 100), fingerprint("D", USER, 101)}) == 4


REFUSALS = [
    (ApplyStatus.CLOSED, errors.ApiClosed),
    (ApplyStatus.INSUFFICIENT, errors.InsufficientBalance),
    (ApplyStatus.LIMIT, errors.BalanceLimit),
    (ApplyStatus.CONFLICT, errors.IdempotencyKeyReused),
    (ApplyStatus.IN_PROGRESS, errors.IdempotencyInProgress),
]


def test_only_refusals_map_to_errors():
    assert {status: type(refusal(ApplyReply(status))) for status, _ in REFUSALS} == dict(REFUSALS)
    assert "12.34" in refusal(ApplyReply(ApplyStatus.INSUFFICIENT, balance=1234)).message
    for status in (ApplyStatus.OK, ApplyStatus.REPLAY, ApplyStatus.SYNC, ApplyStatus.MISSING):
        assert refusal(ApplyReply(status)) is None


# ASYNC charges ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status,error", REFUSALS)
def test_a_refused_charge_raises_its_error_and_publishes_nothing(ledger, store, published, status, error):
    store.replies = [ApplyReply(status, balance=50, version=3)]
    with pytest.raises(error):
        ledger.deduct(USER, 100, "key-1")
    assert published == [] and store.rollbacks == [] and store.done == []


def test_a_deduct_is_answered_after_its_event_is_published(ledger, store, published):
    store.replies = [ok(900, version=4, epoch="e9")]
    result = ledger.deduct(USER, 100, "key-1")
    charge = store.charges[0]
    assert (charge.kind, charge.amount, charge.idem_key, charge.fingerprint) == (
        "D",
        100,
        "c:key-1",
        fingerprint("D", USER, 100),
    )
    assert (result.entry_id, result.balance, result.version, result.mode) == (charge.entry_id, 900, 4, "ASYNC")
    assert [verified_fields(event) for event in published] == [
        {
            "type": "ledger",
            "id": charge.entry_id,
            "kind": "D",
            "user_id": USER,
            "amount": 100,
            "balance_after": 900,
            "version": 4,
            "epoch": "e9",
            "ts": charge.ts,
            "open": "1",
            "idem_key": "c:key-1",
        }
    ]
    assert store.done == [(USER, "c:key-1")]  # a retry now replays without publishing again


def test_without_a_key_there_is_no_fingerprint_and_no_record_to_mark(ledger, store, published):
    store.replies = [ok(1100)]
    ledger.recharge(USER, 100)
    assert store.charges[0].fingerprint == "" and store.charges[0].kind == "R"
    assert len(published) == 1 and store.done == []


def test_with_redis_streams_the_script_made_it_durable_nothing_to_publish(store, published):
    ledger = make_ledger(store, published, transport="redis-stream")
    store.replies = [ok(900)]
    assert ledger.deduct(USER, 100, "key-1").balance == 900
    assert published == [] and store.done == []


def test_a_replay_of_a_durable_charge_answers_the_first_outcome(ledger, store, published):
    store.replies = [ApplyReply(ApplyStatus.REPLAY, entry_id=55, balance=700, version=3, done=True)]
    result = ledger.deduct(USER, 100, "key-1")
    assert (result.entry_id, result.balance, result.version) == (55, 700, 3)
    assert published == [] and store.done == []


def test_a_replay_of_a_request_that_died_publishes_its_entry_again(ledger, store, published):
    store.charge_in_redis(entry(55))
    store.replies = [ApplyReply(ApplyStatus.REPLAY, entry_id=55, balance=900, version=2, done=False)]
    assert ledger.deduct(USER, 100, "key-1").entry_id == 55
    assert [e["id"] for e in published] == [55] and store.done == [(USER, "c:key-1")]


def test_a_replay_whose_entry_is_persisted_already_publishes_nothing(ledger, store, published):
    store.replies = [ApplyReply(ApplyStatus.REPLAY, entry_id=55, balance=900, version=2, done=False)]
    assert ledger.deduct(USER, 100, "key-1").entry_id == 55
    assert published == [] and store.done == []


def test_a_replay_whose_republish_fails_leaves_the_entry_to_the_reconciler(store, published):
    def broker_down(key, value):
        raise NotAcknowledged("no ack")

    ledger = make_ledger(store, published, publish=broker_down)
    store.charge_in_redis(entry(55))
    store.replies = [ApplyReply(ApplyStatus.REPLAY, entry_id=55, balance=900, version=2, done=False)]
    assert ledger.deduct(USER, 100, "key-1").entry_id == 55
    assert store.done == [] and store.rollbacks == []


def test_a_missing_cache_is_loaded_with_what_the_db_lacks_then_charged(ledger, store, published):
    store.account_row(balance=1000, version=5)
    store.charge_in_redis(entry(40, amount=300))  # charged in Redis, not in the DB: counts
    store.charge_in_redis(entry(41, amount=50, kind="R"))
    store.charge_in_redis(entry(42, amount=200))  # in the DB already, not settled yet: counted in its balance
    store.rows[42] = ("D", USER, 200, 2, 800, "ASYNC", None)
    store.replies = [ApplyReply(ApplyStatus.MISSING), ok(650)]
    assert ledger.deduct(USER, 100).balance == 650
    assert [(u, balance) for u, balance, _ in store.loads] == [(USER, 1000 - 300 + 50)]
    assert len(store.charges) == 2 and store.charges[0].entry_id != store.charges[1].entry_id  # fresh id per attempt
    assert len(published) == 1


def test_an_account_the_db_does_not_hold_is_not_found(ledger, store):
    store.replies = [ApplyReply(ApplyStatus.MISSING)]
    with pytest.raises(errors.AccountNotFound):
        ledger.deduct(USER, 100)


def test_a_lost_script_answer_is_outcome_unknown_naming_the_entry(ledger, store, published):
    store.replies = [RedisOutcomeUnknown("timeout")]
    with pytest.raises(errors.ChargeOutcomeUnknown) as raised:
        ledger.deduct(USER, 100)
    entry_id = str(store.charges[0].entry_id)
    assert (
        raised.value.details == {"entry_id": entry_id} and f"/accounts/{USER}/orders/{entry_id}" in raised.value.message
    )
    assert published == []


def test_an_unreachable_redis_means_nothing_was_charged(ledger, store):
    store.replies = [RedisUnavailable("connection refused")]
    with pytest.raises(RedisUnavailable) as raised:
        ledger.deduct(USER, 100)
    assert not isinstance(
        raised.value, (RedisOutcomeUnknown, errors.DomainError)
    )  # the API answers 503, not OUTCOME_UNKNOWN


def broker_down(key, value):
    raise NotAcknowledged("no acknowledgement in time")


def test_a_publish_failure_is_undone_and_answered_publish_failed(store, published):
    ledger = make_ledger(store, published, publish=broker_down)
    store.replies = [ok(900)]
    with pytest.raises(errors.PublishFailed):
        ledger.deduct(USER, 100, "key-1")
    entry_id = store.charges[0].entry_id
    assert store.undo_steps == [("record", entry_id), ("give back", entry_id)]  # the DB's verdict first
    assert store.rolled == {entry_id} and store.done == []


def test_a_publish_failure_whose_entry_the_writer_persisted_first_stands(store, published):
    """The DB decides (under the account row lock): persisted first, the charge stands whatever Redis says."""

    def arrived_and_persisted(key, value):
        store.rows[json.loads(value)["id"]] = ("D", USER, 100, 2, 900, "ASYNC", None)
        raise NotAcknowledged("no acknowledgement in time")

    ledger = make_ledger(store, published, publish=arrived_and_persisted)
    store.replies = [ok(900)]
    result = ledger.deduct(USER, 100)
    assert (result.entry_id, result.balance) == (store.charges[0].entry_id, 900)
    assert store.rollbacks == [] and store.rolled == set()


def test_a_publish_failure_whose_rollback_the_db_cannot_record_is_outcome_unknown(store, published):
    """No verdict: the charge is left pending in Redis (not given back), the DB decides later."""
    ledger = make_ledger(store, published, publish=broker_down)
    store.replies, store.record_error = [ok(900)], DatabaseUnavailable("gone")
    with pytest.raises(errors.ChargeOutcomeUnknown):
        ledger.deduct(USER, 100)
    assert store.rollbacks == [] and store.rolled == set()


def test_a_replay_of_a_key_whose_charge_the_db_rolled_back_gives_it_back_and_charges_afresh(ledger, store, published):
    """The first request answered OUTCOME_UNKNOWN after the DB's verdict (Redis could not give it back)."""
    store.charge_in_redis(entry(55))
    store.rolled.add(55)
    store.replies = [ApplyReply(ApplyStatus.REPLAY, entry_id=55, balance=900, version=2, done=False), ok(900)]
    result = ledger.deduct(USER, 100, "key-1")
    assert result.entry_id != 55 and store.rollbacks == [55]
    assert [e["id"] for e in published] == [result.entry_id]


def test_a_publish_failure_whose_undo_cannot_reach_redis_is_outcome_unknown(store, published):
    ledger = make_ledger(store, published, publish=broker_down)
    store.replies, store.rollback_reply = [ok(900)], RedisUnavailable("gone")
    with pytest.raises(errors.ChargeOutcomeUnknown) as raised:
        ledger.recharge(USER, 100)
    assert raised.value.details["entry_id"] == str(store.charges[0].entry_id)


@pytest.mark.parametrize("amount", [0, -1, 10**17])
def test_an_amount_out_of_range_never_reaches_redis(ledger, store, amount):
    with pytest.raises(errors.DomainError):
        ledger.deduct(USER, amount)
    assert store.charges == []


# SYNC charges ---------------------------------------------------------------------------------------------
@pytest.fixture
def sync(store):
    store.account_row(deduct_type="SYNC", balance=1000, version=3, threshold=100)
    store.replies = [ApplyReply(ApplyStatus.SYNC)] * 3
    return store


def test_a_sync_deduct_moves_the_db_and_leaves_the_cache_to_serve_the_mode(ledger, sync):
    result = ledger.deduct(USER, 400, "key-1")
    assert (result.balance, result.version, result.mode) == (600, 4, "SYNC")
    assert (sync.accounts[USER].balance, sync.accounts[USER].version) == (600, 4)
    assert sync.rows[result.entry_id] == ("D", USER, 400, 4, 600, "SYNC", "c:key-1")
    assert sync.updates == []


def test_a_sync_deduct_to_zero_closes_the_api_and_a_recharge_reopens_it(ledger, store):
    store.account_row(deduct_type="SYNC", balance=300, threshold=-1000)
    store.replies = [ApplyReply(ApplyStatus.SYNC)] * 3
    ledger.deduct(USER, 300)
    assert (store.accounts[USER].balance, store.accounts[USER].open_flag) == (0, "BALANCE")
    with pytest.raises(errors.ApiClosed):
        ledger.deduct(USER, 1)
    ledger.recharge(USER, 1)
    assert (store.accounts[USER].balance, store.accounts[USER].open_flag) == (1, "1")


def test_a_sync_recharge_does_not_reopen_an_operators_close(ledger, sync):
    sync.set_open(USER, "ADMIN")
    assert ledger.recharge(USER, 500).balance == 1500
    assert sync.accounts[USER].open_flag == "ADMIN"
    with pytest.raises(errors.ApiClosed):
        ledger.deduct(USER, 1)


@pytest.mark.parametrize(
    "kind,balance,amount,error",
    [("deduct", 1000, 901, errors.InsufficientBalance), ("recharge", MAX_BALANCE - 50, 51, errors.BalanceLimit)],
)
def test_a_refused_sync_charge_changes_nothing_but_is_the_keys_answer(ledger, sync, kind, balance, amount, error):
    sync.set_balance(USER, balance, 3)
    sync.replies = [ApplyReply(ApplyStatus.SYNC)] * 4
    before = dict(sync.accounts)
    with pytest.raises(error) as first:
        getattr(ledger, kind)(USER, amount, "key-1")
    assert sync.accounts == before and sync.rows == {} and sync.updates == []
    assert sync.answers[(USER, "c:key-1")].answer["balance"] == balance
    sync.set_balance(USER, balance - 1000 if kind == "recharge" else balance + 1000, 4)  # it would pass now
    with pytest.raises(error) as again:
        getattr(ledger, kind)(USER, amount, "key-1")
    assert again.value.message == first.value.message and sync.rows == {}
    with pytest.raises(errors.IdempotencyKeyReused):  # another request with the key is still a conflict
        getattr(ledger, kind)(USER, amount + 1, "key-1")
    getattr(ledger, kind)(USER, amount)  # without a key nothing is remembered
    assert len(sync.answers) == 1


def test_a_sync_deduct_down_to_the_threshold_is_allowed(ledger, sync):
    assert ledger.deduct(USER, 900).balance == 100


def test_a_sync_retry_answers_the_first_outcome_and_another_body_is_a_conflict(ledger, sync):
    first = ledger.deduct(USER, 400, "key-1")
    assert ledger.deduct(USER, 400, "key-1") == first
    assert sync.accounts[USER].balance == 600 and len(sync.rows) == 1
    with pytest.raises(errors.IdempotencyKeyReused):
        ledger.deduct(USER, 401, "key-1")


def test_a_sync_cache_of_an_async_account_is_dropped_and_the_charge_made_in_redis(ledger, store, published):
    store.account_row(deduct_type="ASYNC")
    store.cache[USER] = CachedAccount(1000, 1, 0, "1")
    store.replies = [ApplyReply(ApplyStatus.SYNC), ok(900)]
    result = ledger.deduct(USER, 100)
    assert result.mode == "ASYNC" and store.dropped == [USER] and store.rows == {} and len(published) == 1


def test_a_sync_commit_whose_answer_is_lost_is_outcome_unknown(ledger, sync):
    sync.commit_error = CommitOutcomeUnknown("lost connection")
    with pytest.raises(errors.ChargeOutcomeUnknown) as raised:
        ledger.deduct(USER, 400)
    assert int(raised.value.details["entry_id"]) in sync.rows  # the lookup finds it


def test_a_sync_charge_stands_when_the_cache_update_after_the_commit_fails(ledger, sync):
    sync.cache_error = RedisUnavailable("gone")  # the reconciler evicts the older cache
    assert ledger.deduct(USER, 400).balance == 600


# accounts and the order lookup ------------------------------------------------------------------------------
def test_an_order_is_pending_in_redis_then_persisted_and_a_recharge_is_no_order(ledger, store):
    store.charge_in_redis(entry(60, amount=250, balance_after=750))
    assert (ledger.get_deduct(USER, 60).status, ledger.get_deduct(USER, 60).balance_after) == ("PENDING", 750)
    store.redis_entries.clear()
    store.rows[60] = ("D", USER, 250, 2, 750, "ASYNC", None)
    assert (ledger.get_deduct(USER, 60).status, ledger.get_deduct(USER, 60).amount) == ("PERSISTED", 250)
    store.charge_in_redis(entry(61, kind="R"))
    with pytest.raises(errors.OrderNotFound):
        ledger.get_deduct(USER, 61)


def test_an_async_account_reads_its_cache_loading_it_when_missing(ledger, store):
    store.account_row(balance=1000, version=2)
    store.charge_in_redis(entry(40, amount=300))
    account = ledger.get_account(USER)
    assert (account.balance, account.pending_orders, account.api_open) == (700, 1, True)
    store.cache[USER] = CachedAccount(650, 3, 0, "BALANCE")
    account = ledger.get_account(USER)
    assert (account.balance, account.version, account.api_open) == (650, 3, False) and len(store.loads) == 1


def test_a_switch_to_sync_waits_for_pending_entries(ledger, store):
    store.account_row()
    store.to_sync_reply = ToSyncReply(ToSyncStatus.PENDING, 2)
    with pytest.raises(errors.PendingOrders, match="2 orders"):
        ledger.patch_account(USER, "SYNC", 500, None)
    assert (store.accounts[USER].deduct_type, store.accounts[USER].threshold) == ("ASYNC", 0)


def test_an_operators_close_goes_to_the_db_and_the_cache(ledger, store):
    store.account_row(deduct_type="SYNC")
    ledger.patch_account(USER, None, 300, False)
    assert (store.accounts[USER].open_flag, store.accounts[USER].threshold) == ("ADMIN", 300)
    assert store.updates == [(USER, {"threshold": 300})] and store.open_sets == [(USER, "ADMIN", 1)]
    ledger.patch_account(USER, "ASYNC", None, None)  # the DB is authoritative now: the cache is reloaded from it
    assert store.dropped == [USER]


@pytest.mark.parametrize("api_open,flag", [(False, "ADMIN"), (True, "1")])
def test_an_operators_close_or_reopen_takes_a_version_above_every_entry_charged_before_it(
    ledger, store, api_open, flag
):
    """So the writer, which takes an entry's open flag only when it is newer than the DB, never undoes it."""
    store.account_row(version=3, open_flag="1" if not api_open else "ADMIN")
    store.cache[USER] = CachedAccount(1000, 9, 0, store.accounts[USER].open_flag)  # entries up to v9 are in flight
    ledger.patch_account(USER, None, None, api_open)
    assert (store.cache[USER].version, store.cache[USER].open_flag) == (10, flag)
    assert (store.accounts[USER].version, store.accounts[USER].open_flag) == (10, flag)
    LedgerPersister(store, FakeOutbox()).persist([event(1, version=9, open_flag="ADMIN" if api_open else "1")])
    assert store.accounts[USER].open_flag == flag


def test_an_operators_close_of_an_uncached_account_raises_the_db_version(ledger, store):
    store.account_row(version=3)
    ledger.patch_account(USER, None, None, False)
    assert store.open_sets == [(USER, "ADMIN", 3)] and store.accounts[USER].version == 4


def test_an_operators_close_the_db_did_not_commit_drops_the_cache_it_went_ahead_in(ledger, store):
    store.account_row(version=3)
    store.cache[USER] = CachedAccount(1000, 5, 0, "1")
    store.commit_error = RuntimeError("the DB went away")
    with pytest.raises(RuntimeError):
        ledger.patch_account(USER, None, None, False)
    assert USER not in store.cache  # the next read reloads it from the DB


# the writer's ledger persister --------------------------------------------------------------------------------
def test_the_persister_sums_deltas_per_account_and_keeps_the_highest_version(store):
    store.account_row(USER, balance=1000, version=1)
    store.account_row(8, balance=0, version=1, open_flag="BALANCE")
    batch = [
        event(3, 100, version=4, open_flag="1"),
        event(1, 200, version=2),
        event(2, 50, kind="R", version=3),
        event(9, 70, kind="R", user_id=8, version=2),
    ]
    report = LedgerPersister(store, FakeOutbox()).persist(batch)
    assert (report.applied, report.duplicates, report.dead_lettered) == (4, 0, 0)
    assert (store.accounts[USER].balance, store.accounts[USER].version) == (750, 4)
    assert (store.accounts[8].balance, store.accounts[8].version, store.accounts[8].open_flag) == (70, 2, "1")
    assert store.settled == [{USER: [1, 2, 3], 8: [9]}]


def test_the_persister_takes_the_open_flag_only_from_a_change_newer_than_the_db(store):
    store.account_row(balance=1000, version=5, open_flag="ADMIN")
    LedgerPersister(store, FakeOutbox()).persist([event(1, 100, version=4, open_flag="1")])
    assert (store.accounts[USER].balance, store.accounts[USER].version, store.accounts[USER].open_flag) == (
        900,
        5,
        "ADMIN",
    )


def test_the_persister_skips_repeats_and_rolled_back_entries_and_dead_letters_orphans_and_clashes(store):
    store.account_row(balance=1000, version=1)
    store.rows[1] = ("D", USER, 100, 2, 900, "ASYNC", None)  # persisted by an earlier batch
    store.rows[2] = ("D", USER, 999, 2, 1, "ASYNC", None)  # the same id with other content
    store.rolled.add(4)  # the API recorded its rollback (and only then set the Redis tombstone)
    outbox = FakeOutbox()
    batch = [event(1), event(1), event(2), event(3, version=3), event(4, version=4), event(5, user_id=404)]
    report = LedgerPersister(store, outbox).persist(batch)
    assert (report.applied, report.duplicates, report.rolled_back, report.dead_lettered) == (1, 2, 1, 2)
    assert store.accounts[USER].balance == 900 and 4 not in store.rows and store.rows[2][2] == 999
    assert sorted((r.offset, r.error) for r in outbox.dead) == [
        (2, "entry id already used by another entry"),
        (5, "account does not exist"),
    ]
    assert store.settled == [{USER: [1, 2, 3]}]  # the orphan has no account to settle


def test_the_persister_skips_an_entry_the_db_rolled_back_whatever_redis_says_and_gives_it_back(store):
    """Redis lost the tombstone (or it expired before a replay): the DB's record decides."""
    store.account_row(balance=1000, version=1)
    store.rolled.add(4)
    report = LedgerPersister(store, FakeOutbox()).persist([event(3, version=3), event(4, version=4)])
    assert (report.applied, report.rolled_back) == (1, 1)
    assert 4 not in store.rows and store.accounts[USER].balance == 900
    assert store.settled == [{USER: [3]}] and store.rollbacks == [4]


def test_the_persister_reports_accounts_charged_from_an_earlier_cache_load(store):
    store.account_row(USER)
    store.account_row(8)
    report = LedgerPersister(store, FakeOutbox()).persist([event(1, epoch="old"), event(2, user_id=8)])
    assert report.flagged_accounts == [USER]


# the accounts part of the reconciler --------------------------------------------------------------------------
class FakePersister:
    def __init__(self):
        self.events = []

    def persist(self, events):
        self.events += events
        return PersistReport(applied=len(events))


NOW = 1_000_000


def test_stale_pending_entries_are_persisted_and_expired_ids_forgotten(store):
    store.account_row(balance=1000)
    store.charge_in_redis(entry(1), ts=NOW - 400_000)  # stale
    store.charge_in_redis(entry(2), ts=NOW - 1_000)  # young: the writer still has time
    store.pending[USER][3] = NOW - 500_000  # its entry string expired
    persister = FakePersister()
    report = LedgerReconcile(store, persister).run(NOW, age_s=300)
    assert [e.id for e in persister.events] == [1] and store.forgotten == [3]
    assert (report.pending, report.compensated, report.lost_entries, report.oldest_pending_age_s) == (3, 1, 1, 500.0)


def test_an_async_cache_behind_the_db_is_corrected_to_db_plus_what_the_db_lacks(store):
    store.account_row(balance=1000, version=9)
    store.cache[USER] = CachedAccount(1000, 5, 0, "1")  # version behind the DB's
    store.charge_in_redis(entry(1, amount=200), ts=NOW)
    report = LedgerReconcile(store, FakePersister()).run(NOW, age_s=300)
    assert report.corrected == 1 and store.reconciled == [(USER, -200, 9)] and store.cache[USER].balance == 800


def test_an_async_cache_that_agrees_with_the_db_is_left_alone_unless_flagged(store):
    store.account_row(balance=1000, version=2)
    store.cache[USER] = CachedAccount(800, 3, 0, "1")
    store.charge_in_redis(entry(1, amount=200), ts=NOW)
    reconcile = LedgerReconcile(store, FakePersister())
    assert reconcile.run(NOW, age_s=300).corrected == 0 and store.reconciled == []
    store.dirty.add(USER)  # the writer saw entries charged from an earlier load
    assert reconcile.run(NOW, age_s=300).corrected == 1


def test_a_correction_takes_its_snapshot_again_when_an_entry_it_saw_is_rolled_back_meanwhile(store):
    store.account_row(balance=1000, version=9)
    store.cache[USER] = CachedAccount(1500, 5, 0, "1")  # 300 too much, beside entry 1's 200
    store.charge_in_redis(entry(1, amount=200, kind="R"), ts=NOW)
    store.dirty.add(USER)
    snapshot, calls = store.snapshot, []

    def snapshot_then_rollback(user_id, limit):
        seen = snapshot(user_id, limit)
        calls.append(seen)
        if len(calls) == 2:  # inside the correction: entry 1 is rolled back before its string is read
            del store.redis_entries[(USER, 1)]
            del store.pending[USER][1]
            store.cache[USER] = replace(store.cache[USER], balance=store.cache[USER].balance - 200)
        return seen

    store.snapshot = snapshot_then_rollback
    assert LedgerReconcile(store, FakePersister()).run(NOW, age_s=300).corrected == 1
    assert len(calls) == 3 and store.cache[USER].balance == 1000


def test_an_account_with_more_pending_entries_than_the_limit_is_deferred_and_its_oldest_persisted(store):
    store.account_row(balance=1000, version=9)
    store.cache[USER] = CachedAccount(1500, 5, 0, "1")
    for i in range(1, 6):
        store.charge_in_redis(entry(i), ts=NOW - 400_000 - i)
    persister = FakePersister()
    report = LedgerReconcile(store, persister, pending_limit=2).run(NOW, age_s=300)
    assert [e.id for e in persister.events] == [5, 4]  # the oldest two of five stale: bounded per run
    assert (report.pending, report.deferred, report.corrected, store.reconciled) == (5, 1, 0, [])


def test_a_sync_cache_behind_the_db_is_left_as_it_is(store):
    store.account_row(USER, deduct_type="SYNC", version=4)
    store.cache[USER] = CachedAccount(1000, 3, 0, "1")
    report = LedgerReconcile(store, FakePersister()).run(NOW, age_s=300)
    assert (report.corrected, store.dropped, store.reconciled, report.accounts) == (0, [], [], 1)


def test_the_reconciler_pages_through_every_account(store):
    for user_id in range(1, 8):
        store.account_row(user_id)
    assert LedgerReconcile(store, FakePersister(), page=3).run(NOW, age_s=300).accounts == 7


# Idempotency-Keys: a refusal is an answer, keys outlive Redis ---------------------------------------------------
@pytest.mark.parametrize("status,error", REFUSALS[:3])
def test_an_async_business_refusal_with_a_key_is_kept_in_the_db_before_it_is_answered(ledger, store, status, error):
    store.replies = [ApplyReply(status, balance=50, version=3)]
    with pytest.raises(error):
        ledger.deduct(USER, 100, "key-1")
    assert store.answers == {
        (USER, "c:key-1"): IdempotentAnswer(
            fingerprint("D", USER, 100), {"refused": status.value, "balance": 50, "version": 3}
        )
    }
    store.replies = [ApplyReply(status, balance=50, version=3)]
    with pytest.raises(error):
        ledger.deduct(USER, 100)  # no key: nothing to remember
    assert len(store.answers) == 1


def test_a_conflict_or_a_transient_failure_is_not_the_keys_answer(store, published):
    store.replies = [ApplyReply(ApplyStatus.CONFLICT), ApplyReply(ApplyStatus.IN_PROGRESS), ok(900)]
    for error in (errors.IdempotencyKeyReused, errors.IdempotencyInProgress):
        with pytest.raises(error):
            make_ledger(store, published).deduct(USER, 100, "key-1")
    with pytest.raises(errors.PublishFailed):
        make_ledger(store, published, publish=broker_down).deduct(USER, 100, "key-1")
    assert store.answers == {}


def test_a_key_redis_does_not_know_is_looked_up_in_the_db_once_then_charged(ledger, store, published):
    store.replies = [ApplyReply(ApplyStatus.UNKNOWN_KEY), ok(900)]
    result = ledger.deduct(USER, 100, "key-1")
    assert store.answer_reads == [(USER, "c:key-1")]
    assert [c.key_checked for c in store.charges] == [False, True]
    assert store.charges[0].entry_id == store.charges[1].entry_id == result.entry_id and len(published) == 1


def test_a_key_the_db_answered_is_replayed_without_charging(ledger, store, published):
    store.answers[(USER, "c:key-1")] = IdempotentAnswer(
        fingerprint("D", USER, 100),
        {"entry_id": 55, "user_id": USER, "amount": 100, "balance": 700, "version": 6, "mode": "SYNC"},
    )
    store.replies = [ApplyReply(ApplyStatus.UNKNOWN_KEY)]
    result = ledger.deduct(USER, 100, "key-1")
    assert (result.entry_id, result.balance, result.version, result.mode) == (55, 700, 6, "SYNC")
    assert len(store.charges) == 1 and published == []
    store.replies = [ApplyReply(ApplyStatus.UNKNOWN_KEY)]
    with pytest.raises(errors.IdempotencyKeyReused):  # the fingerprint binds the kind: a recharge may not take it
        ledger.recharge(USER, 100, "key-1")


def test_a_refusal_the_db_holds_is_answered_again_with_its_message(ledger, store, published):
    store.answers[(USER, "c:key-1")] = IdempotentAnswer(
        fingerprint("D", USER, 100), {"refused": "insufficient", "balance": 1234, "version": 6}
    )
    store.replies = [ApplyReply(ApplyStatus.UNKNOWN_KEY)]
    with pytest.raises(errors.InsufficientBalance, match="12.34"):
        ledger.deduct(USER, 100, "key-1")
    assert len(store.charges) == 1 and published == []


def test_a_sync_charge_answers_a_key_an_async_charge_took(ledger, sync):
    sync.answers[(USER, "c:key-1")] = IdempotentAnswer(
        fingerprint("D", USER, 100),
        {"entry_id": 55, "user_id": USER, "amount": 100, "balance": 700, "version": 6, "mode": "ASYNC"},
    )
    result = ledger.deduct(USER, 100, "key-1")
    assert (result.entry_id, result.mode) == (55, "ASYNC") and sync.rows == {}


def test_the_persister_keeps_each_entrys_key_answer_and_never_a_second_entry_for_a_key(store):
    store.account_row(balance=1000, version=1)
    store.answers[(USER, "old")] = IdempotentAnswer(
        "fp", {"entry_id": 1, "user_id": USER, "amount": 100, "balance": 900, "version": 2, "mode": "ASYNC"}
    )
    store.answers[(USER, "refused")] = IdempotentAnswer("fp", {"refused": "insufficient", "balance": 0, "version": 1})
    keyed = [
        replace(entry(entry_id, version=entry_id), idem_key=key).to_event()
        for entry_id, key in ((2, "new"), (3, "new"), (4, "old"), (5, "refused"), (6, None))
    ]
    outbox = FakeOutbox()
    report = LedgerPersister(store, outbox).persist(keyed)
    assert (report.applied, report.dead_lettered) == (3, 2) and sorted(store.rows) == [2, 5, 6]
    assert store.accounts[USER].balance == 700
    assert sorted((r.offset, r.error) for r in outbox.dead) == [
        (3, "Idempotency-Key already answered by another entry"),
        (4, "Idempotency-Key already answered by another entry"),
    ]
    assert store.answers[(USER, "new")] == IdempotentAnswer(
        fingerprint("D", USER, 100),
        {"entry_id": 2, "user_id": USER, "amount": 100, "balance": 900, "version": 2, "mode": "ASYNC"},
    )
    assert store.answers[(USER, "refused")].answer["entry_id"] == 5  # charged before the refusal: the entry wins
    assert store.settled == [{USER: [2, 3, 4, 5, 6]}]


@pytest.mark.parametrize(
    "key,final",
    [
        ("client-1", True),
        (ServiceKey("rp12"), False),
        (ServiceKey("rprefund12"), False),
        (ServiceKey("payorder12"), False),
        ("payorder12", True),
        ("rp12", True),
        (None, False),
    ],
)
def test_a_refusal_is_the_answer_of_every_client_key_not_of_the_services_own(key, final):
    from hotledger.ledger.service import refusal_is_answer

    assert refusal_is_answer(stored_key(key)) is final


@pytest.mark.parametrize(
    "key,stored",
    [
        ("client-1", "c:client-1"),
        ("payorder12", "c:payorder12"),
        ("c:rp1", "c:c:rp1"),
        (ServiceKey("payorder12"), "payorder12"),
        (None, None),
        ("", None),
    ],
)
def test_client_keys_live_in_a_namespace_no_service_key_can_take(key, stored):
    assert stored_key(key) == stored


def test_a_client_key_spelled_like_a_service_key_is_charged_under_its_own_namespace(store, published):
    store.replies = [ApplyReply(ApplyStatus.INSUFFICIENT, balance=50, version=3)]
    with pytest.raises(errors.InsufficientBalance):
        make_ledger(store, published).deduct(USER, 100, "payorder12")
    assert store.charges[0].idem_key == "c:payorder12" and list(store.answers) == [(USER, "c:payorder12")]


def test_a_refusal_of_a_service_key_is_not_remembered(store, published):
    store.replies = [ApplyReply(ApplyStatus.INSUFFICIENT, balance=50, version=3)]
    with pytest.raises(errors.InsufficientBalance):
        make_ledger(store, published).deduct(USER, 100, ServiceKey("payorder12"))
    assert store.answers == {} and store.charges[0].refusal_final is False
