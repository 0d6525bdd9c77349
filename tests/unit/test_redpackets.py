"""Red packets' decisions with in-memory stores: the split, send, grab, expiry, the writer's persister and the
reconciler. No server is reached: the DB, Redis, the broker, the ledger and the delay queue are fakes here."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
from dataclasses import replace

import pytest

from fakes import FakeOutbox
from helpers import run_event_keys, verified_fields
from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.publisher import NotAcknowledged
from hotledger.dal.redis_store import RedisOutcomeUnknown, RedisUnavailable
from hotledger.outbox.durable import Durability
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.outbox.log_hold import LogHold
from hotledger.outbox.writer import REJECTED_TOPIC
from hotledger.redpackets.persist import RedPacketPersister
from hotledger.redpackets.reconcile import PacketReconciler
from hotledger.redpackets.replies import ExpireReply, ExpireStatus, GrabReply, GrabStatus
from hotledger.redpackets.rows import ClaimedItem, ItemRow, PacketRow
from hotledger.redpackets.service import EXPIRY_RETRY_MS, PACKET_EXPIRY, Expiry, RedPackets
from hotledger.redpackets.split import split

NOW = 1_800_000_000_000
HOLD_S = 10
SENDER, ALICE, BOB = 1, 2, 3


# fakes ---------------------------------------------------------------------------------------------------
class FakeTx:
    def __init__(self, store: FakeStore):
        self.store, self.cursor = store, None  # the fake outbox ignores the cursor of its dead letters

    def packet_for_update(self, packet_id):
        p = self.store.packets.get(packet_id)
        return None if p is None else (p.state, p.expires_at)

    def items(self, packet_id):
        return [i for i in self.store.items.values() if i.packet_id == packet_id]

    def lock_for_claims(self, packet_ids, item_ids):
        return {i: self.store.items[i] for i in item_ids if i in self.store.items}

    def record_rollback(self, packet_id, item_id, grab_id, user_id):
        item = self.store.items.get(item_id)
        if item is not None and item.user_id == user_id:
            return True
        self.store.rolled.add(grab_id)
        return False

    def rolled_back(self, grab_ids):
        return {g for g in grab_ids if g in self.store.rolled}

    def stamp_claims(self, claims):
        for c in claims:
            if self.store.items[c.item_id].user_id is None:
                self.store.items[c.item_id] = replace(self.store.items[c.item_id], user_id=c.user_id, claimed_at=c.ts)


class FakeStore:
    """t_red_packet, t_red_packet_item, and the ledger's t_pay and t_order as sets of (idem key, user)."""

    def __init__(self):
        self.packets: dict[int, PacketRow] = {}
        self.items: dict[int, ItemRow] = {}
        self.credited: set[int] = set()
        self.pay: set[tuple[str, int]] = set()
        self.orders: set[tuple[str, int]] = set()
        self.fail_mark_open: Exception | None = None
        self.rolled: set[int] = set()  # t_rolled_back: grab ids

    def add(self, packet_id, state, amounts, sender=SENDER, expires_at=NOW + 60_000, refund=None):
        self.packets[packet_id] = PacketRow(packet_id, sender, state, sum(amounts), len(amounts), refund, expires_at)
        for n, amount in enumerate(amounts, 1):
            self.items[packet_id * 100 + n] = ItemRow(packet_id * 100 + n, packet_id, amount)

    def state(self, packet_id):
        return self.packets[packet_id].state

    def _move(self, packet_id, from_state, to_state, **changes):
        if self.packets[packet_id].state == from_state:
            self.packets[packet_id] = replace(self.packets[packet_id], state=to_state, **changes)

    @contextlib.contextmanager
    def transaction(self):
        yield FakeTx(self)

    def insert(self, packet_id, sender_id, total, expires_at, items):
        if packet_id in self.packets:
            return False
        self.packets[packet_id] = PacketRow(packet_id, sender_id, "CREATING", total, len(items), None, expires_at)
        self.items.update({i: ItemRow(i, packet_id, a) for i, a in items})
        return True

    def mark_failed(self, packet_id):
        self._move(packet_id, "CREATING", "FAILED")

    def mark_open(self, packet_id, debit_entry_id):
        if self.fail_mark_open:
            raise self.fail_mark_open
        self._move(packet_id, "CREATING", "OPEN")

    def failed_with_debit(self, limit):
        return sorted(
            p.packet_id
            for p in self.packets.values()
            if p.state == "FAILED" and (f"rp{p.packet_id}", p.sender_id) in self.orders
        )

    def begin_failed_refund(self, packet_id):
        p = self.packets[packet_id]
        if p.state != "FAILED" or (f"rp{packet_id}", p.sender_id) not in self.orders:
            return False
        rest = [i for i in self.items.values() if i.packet_id == packet_id and i.user_id is None]
        for i in rest:
            self.items[i.item_id] = replace(i, refunded=True)
        self._move(packet_id, "FAILED", "REFUNDING", refund=sum(i.amount for i in rest))
        return True

    def begin_refund(self, packet_id):
        if self.packets[packet_id].state != "OPEN":
            return False
        rest = [i for i in self.items.values() if i.packet_id == packet_id and i.user_id is None]
        for i in rest:
            self.items[i.item_id] = replace(i, refunded=True)
        self._move(packet_id, "OPEN", "REFUNDING", refund=sum(i.amount for i in rest))
        return True

    def mark_refunded(self, packet_id):
        self._move(packet_id, "REFUNDING", "REFUNDED")

    def packet(self, packet_id):
        return self.packets.get(packet_id)

    def persisted_grabs(self, packet_id):
        return sorted((i.user_id, i.amount) for i in self.items.values() if i.packet_id == packet_id and i.user_id)

    def creating(self, created_before, limit):
        return [p for p in self.packets.values() if p.state == "CREATING"]

    def open_ids(self, after_id=0, limit=2**62):
        return sorted(p.packet_id for p in self.packets.values() if p.state == "OPEN" and p.packet_id > after_id)[
            :limit
        ]

    def refunding_ids(self, limit):
        return [p.packet_id for p in self.packets.values() if p.state == "REFUNDING"]

    def refund_paid(self, packet_id, sender_id):
        return (f"rprefund{packet_id}", sender_id) in self.pay

    def uncredited_claims(self, claimed_before, limit):
        return [
            ClaimedItem(i.item_id, i.user_id, i.amount, (f"rp{i.item_id}", i.user_id) in self.pay)
            for i in self.items.values()
            if i.user_id and i.item_id not in self.credited and i.claimed_at < claimed_before
        ]

    def mark_credited(self, item_ids):
        self.credited.update(item_ids)


class FakeCache:
    def __init__(self):
        self.grab_replies: list = []  # GrabReply or an exception to raise, in order
        self.grab_ids: list[int] = []
        self.rolled_back: list[tuple] = []
        self.loaded: list[tuple] = []
        self.expire_replies: dict[int, ExpireReply] = {}
        self.expire_calls: list[int] = []
        self.retired: list[int] = []
        self.opened: list[int] = []
        self.settled: list[RedPacketClaimEvent] = []
        self.redis_grabs: dict[int, list] = {}
        self.pending: dict[int, list[RedPacketClaimEvent]] = {}

    def grab(self, packet_id, user_id, grab_id, now_ms):
        self.grab_ids.append(grab_id)
        reply = self.grab_replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def rollback(self, packet_id, grab_id, item_id, user_id, amount):
        self.rolled_back.append((packet_id, grab_id, item_id, user_id, amount))

    def load(self, packet_id, state, expires_at, hold_until, items, hold_log=""):
        self.loaded.append((packet_id, state, hold_until, sorted(i.item_id for i in items if i.user_id is None)))
        return True

    def settle(self, claims):
        self.settled += claims

    def expire(self, packet_id, now_ms):
        self.expire_calls.append(packet_id)
        return self.expire_replies.get(packet_id, ExpireReply(ExpireStatus.OPEN))

    def mark_open(self, packet_id):
        self.opened.append(packet_id)

    def retire(self, packet_id):
        self.retired.append(packet_id)

    def grabs(self, packet_id):
        return self.redis_grabs.get(packet_id, [])

    def pending_claims(self, packet_id):
        return list(self.pending.get(packet_id, []))


class Debit:
    def __init__(self, entry_id):
        self.entry_id = entry_id


class FakeLedger:
    """deduct / recharge / account_exists; a recharge that goes through lands in the store's t_pay."""

    def __init__(self, store: FakeStore):
        self.store = store
        self.deducts: list[tuple] = []
        self.recharges: list[tuple] = []
        self.deduct_error: Exception | None = None
        self.charge_before_error = False  # the error comes after the debit stood
        self.recharge_error: Exception | None = None
        self.accounts = {SENDER, ALICE, BOB}

    def account_exists(self, user_id):
        return user_id in self.accounts

    def deduct(self, user_id, amount, idem_key):
        self.deducts.append((user_id, amount, idem_key))
        if self.deduct_error and not self.charge_before_error:
            raise self.deduct_error
        self.store.orders.add((idem_key, user_id))  # charged (a repeat of the key replays it)
        if self.deduct_error:
            raise self.deduct_error
        return Debit(9000 + len(self.deducts))

    def recharge(self, user_id, amount, idem_key):
        self.recharges.append((user_id, amount, idem_key))
        if self.recharge_error:
            raise self.recharge_error
        self.store.pay.add((idem_key, user_id))


class FakeQueue:
    def __init__(self):
        self.offers: list[tuple] = []

    def offer(self, queue, element, due_at_ms=None, delay_ms=None):
        self.offers.append((queue, element, due_at_ms, delay_ms))


class World:
    def __init__(self):
        self.store, self.cache, self.queue, self.outbox = FakeStore(), FakeCache(), FakeQueue(), FakeOutbox()
        self.ledger = FakeLedger(self.store)
        self.published: list[tuple[str, dict]] = []
        self.publish_error: Exception | None = None
        ids = itertools.count(500)
        self.packets = RedPackets(
            self.store,
            self.cache,
            Durability(Settings(), self.publish, lambda: next(ids), run_event_keys()),
            lambda: next(ids),
            self.ledger,
            self.queue,
            HOLD_S * 1000,
            LogHold(None, dict, "unused", streamed=True),
            rng=random.Random(3),
            clock=lambda: NOW,
        )
        self.persister = RedPacketPersister(
            self.store, self.cache, self.outbox, self.packets.credit_grab, self.packets.undo_grab
        )
        self.reconciler = PacketReconciler(self.packets, self.persister, self.store)

    def publish(self, key, value):
        if self.publish_error:
            raise self.publish_error
        self.published.append((key, json.loads(value)))


@pytest.fixture
def w() -> World:
    return World()


def claim(packet_id, item_id, user_id, amount, grab_id, ts=NOW):
    return RedPacketClaimEvent(
        type="redpacket_claim",
        packet_id=packet_id,
        item_id=item_id,
        user_id=user_id,
        amount=amount,
        ts=ts,
        grab_id=grab_id,
    )


# split ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("total, count", [(10000, 10), (100, 100), (101, 100), (999_999, 7), (5000, 1000), (3, 2)])
def test_split_sums_to_the_total_exactly_and_no_item_is_below_a_cent(total, count):
    for seed in range(20):
        items = split(total, count, random.Random(seed))
        assert len(items) == count and sum(items) == total and min(items) >= 1


def test_split_is_reproducible_from_a_seed_and_varies_between_seeds():
    assert split(10000, 10, random.Random(42)) == split(10000, 10, random.Random(42))
    assert len({tuple(split(10000, 10, random.Random(seed))) for seed in range(10)}) > 1


@pytest.mark.parametrize("total, count", [(99, 100), (0, 1), (5, 0)])
def test_split_refuses_a_total_below_a_cent_per_item(total, count):
    with pytest.raises(errors.TotalTooSmall):
        split(total, count, random.Random(1))


def test_split_into_one_item_gives_the_whole_total():
    assert split(1, 1, random.Random(1)) == [1]
    assert split(12345, 1, random.Random(9)) == [12345]


# send ----------------------------------------------------------------------------------------------------
def test_send_debits_the_sender_once_under_the_packet_key_then_opens_and_schedules_the_expiry(w):
    view = w.packets.create(SENDER, 1000, 4, expires_in_s=60)
    p = view.packet_id
    assert w.ledger.deducts == [(SENDER, 1000, f"rp{p}")]
    assert w.store.state(p) == "OPEN" and view.state == "OPEN" and view.expires_at == NOW + 60_000
    items = [i for i in w.store.items.values() if i.packet_id == p]
    assert len(items) == 4 and sum(i.amount for i in items) == 1000 and min(i.amount for i in items) >= 1
    assert w.cache.loaded == [(p, "OPEN", 0, sorted(i.item_id for i in items))] and w.cache.opened == [p]
    assert w.queue.offers == [(PACKET_EXPIRY, str(p), NOW + 60_000, None)]


def test_send_from_an_unknown_account_stores_nothing(w):
    with pytest.raises(errors.AccountNotFound):
        w.packets.create(77, 1000, 4, expires_in_s=60)
    assert w.store.packets == {} and w.ledger.deducts == []


@pytest.mark.parametrize(
    "refusal",
    [
        errors.InsufficientBalance("short"),
        errors.ApiClosed("closed"),
        errors.AccountNotFound("gone"),
        errors.IdempotencyKeyReused("other request"),
        errors.PublishFailed("undone"),
        errors.ServiceUnavailable("not loaded"),
        errors.FencedOut("fenced"),
    ],
)
def test_a_debit_the_ledger_refused_or_undid_marks_the_packet_failed_and_opens_nothing(w, refusal):
    w.ledger.deduct_error = refusal
    with pytest.raises(type(refusal)):
        w.packets.create(SENDER, 1000, 4, expires_in_s=60)
    (packet,) = w.store.packets.values()
    assert packet.state == "FAILED"
    assert w.cache.loaded == [] and w.queue.offers == []


@pytest.mark.parametrize(
    "failure",
    [
        errors.ChargeOutcomeUnknown("no answer", entry_id="77"),
        errors.IdempotencyInProgress("first attempt running"),
        RedisOutcomeUnknown("timed out"),
        RedisUnavailable("refused"),
        DatabaseUnavailable("gone"),
        ValueError("a bug"),
    ],
)
@pytest.mark.parametrize("charged", [False, True])
def test_a_debit_without_a_definitive_answer_leaves_the_packet_creating_and_the_reconciler_opens_it_once(
    w, failure, charged
):
    w.ledger.deduct_error, w.ledger.charge_before_error = failure, charged
    with pytest.raises(errors.ChargeOutcomeUnknown) as unknown:
        w.packets.create(SENDER, 1000, 4, expires_in_s=60)
    (packet,) = w.store.packets.values()
    assert packet.state == "CREATING" and unknown.value.details["packet_id"] == str(packet.packet_id)
    assert w.queue.offers == [] and w.cache.loaded == []
    w.ledger.deduct_error = None
    report = w.reconciler.run(NOW + 61_000, age_s=60)
    assert (report.opened, report.failed, w.store.state(packet.packet_id)) == (1, 0, "OPEN")
    assert w.ledger.deducts == [(SENDER, 1000, f"rp{packet.packet_id}")] * 2  # the same key: replayed when it stood
    assert w.ledger.recharges == []


def test_a_failure_after_the_debit_is_outcome_unknown_and_the_reconciler_opens_the_packet(w):
    w.store.fail_mark_open = DatabaseUnavailable("gone")
    with pytest.raises(errors.ChargeOutcomeUnknown):
        w.packets.create(SENDER, 1000, 4, expires_in_s=60)
    (packet,) = w.store.packets.values()
    assert packet.state == "CREATING"
    assert w.reconciler.run(NOW, age_s=60).failed == 1  # still failing: counted, the run goes on
    w.store.fail_mark_open = None
    assert w.reconciler.run(NOW, age_s=60).opened == 1 and w.store.state(packet.packet_id) == "OPEN"


# grab ----------------------------------------------------------------------------------------------------
def test_a_grab_publishes_its_claim_and_credits_nothing_before_the_db_accepted_it(w):
    w.store.add(7, "OPEN", [100, 200])
    w.cache.grab_replies = [GrabReply(GrabStatus.OK, item_id=701, amount=100)]
    grab = w.packets.grab(7, ALICE)
    assert (grab.item_id, grab.amount) == (701, 100)
    ((key, event),) = w.published
    assert key == "rp7" and verified_fields(event) == {
        "type": "redpacket_claim",
        "packet_id": 7,
        "item_id": 701,
        "user_id": ALICE,
        "amount": 100,
        "ts": NOW,
        "grab_id": w.cache.grab_ids[0],
    }
    assert w.ledger.recharges == []


@pytest.mark.parametrize(
    "reply, code",
    [
        (GrabReply(GrabStatus.ALREADY, item_id=701, amount=100), "ALREADY_GRABBED"),
        (GrabReply(GrabStatus.EMPTY), "EMPTY"),
        (GrabReply(GrabStatus.EXPIRED), "EXPIRED"),
        (GrabReply(GrabStatus.NOT_OPEN, detail="CREATING"), "PACKET_NOT_OPEN"),
        (GrabReply(GrabStatus.RECOVERING, detail=str(NOW + 5000)), "RECOVERING"),
    ],
)
def test_every_grab_refusal_is_its_error_and_moves_nothing(w, reply, code):
    w.cache.grab_replies = [reply]
    with pytest.raises(errors.DomainError) as refused:
        w.packets.grab(7, ALICE)
    assert refused.value.code == code
    assert w.published == [] and w.ledger.recharges == [] and w.cache.rolled_back == []


def test_a_grab_by_an_unknown_account_runs_no_script(w):
    with pytest.raises(errors.AccountNotFound):
        w.packets.grab(7, 77)
    assert w.cache.grab_ids == []


def test_a_packet_redis_lost_is_rebuilt_with_a_hold_and_the_grab_retried(w):
    w.store.add(7, "OPEN", [100, 200])
    w.store.items[701] = replace(w.store.items[701], user_id=BOB, claimed_at=NOW - 1)
    w.cache.grab_replies = [GrabReply(GrabStatus.MISSING), GrabReply(GrabStatus.OK, item_id=702, amount=200)]
    grab = w.packets.grab(7, ALICE)
    assert w.cache.loaded == [(7, "OPEN", NOW + HOLD_S * 1000, [702])]  # the claimed item is not handed out again
    assert grab.item_id == 702 and len(w.cache.grab_ids) == 2 and w.cache.grab_ids[0] != w.cache.grab_ids[1]


def test_loading_a_finished_packet_retires_its_keys_and_an_unknown_one_is_not_found(w):
    w.store.add(7, "REFUNDED", [100])
    w.cache.grab_replies = [GrabReply(GrabStatus.MISSING), GrabReply(GrabStatus.EXPIRED)]
    with pytest.raises(errors.PacketExpired):
        w.packets.grab(7, ALICE)
    assert w.cache.retired == [7]
    w.cache.grab_replies = [GrabReply(GrabStatus.MISSING)]
    with pytest.raises(errors.PacketNotFound):
        w.packets.grab(8, ALICE)


def test_a_grab_whose_script_answer_was_lost_is_outcome_unknown_and_credits_nothing(w):
    w.cache.grab_replies = [RedisOutcomeUnknown("TimeoutError")]
    with pytest.raises(errors.DomainError) as unknown:
        w.packets.grab(7, ALICE)
    assert unknown.value.code == "OUTCOME_UNKNOWN"
    assert w.published == [] and w.ledger.recharges == [] and w.cache.rolled_back == []


def test_a_claim_the_broker_did_not_acknowledge_is_rolled_back_and_answered_publish_failed(w):
    w.cache.grab_replies = [GrabReply(GrabStatus.OK, item_id=701, amount=100)]
    w.publish_error = NotAcknowledged("no ack")
    with pytest.raises(errors.PublishFailed):
        w.packets.grab(7, ALICE)
    assert w.store.rolled == {w.cache.grab_ids[0]}  # recorded in the DB, then put back in Redis
    assert w.cache.rolled_back == [(7, w.cache.grab_ids[0], 701, ALICE, 100)]
    assert w.ledger.recharges == []


def test_a_claim_the_writer_stamped_before_the_rollback_stands(w):
    """The DB decides under the writer's locks: stamped first, the grab stands whatever Redis says (the writer
    that stamped it credits it)."""
    w.store.add(7, "OPEN", [100])
    w.store.items[701] = replace(w.store.items[701], user_id=ALICE, claimed_at=NOW)
    w.cache.grab_replies = [GrabReply(GrabStatus.OK, item_id=701, amount=100)]
    w.publish_error = NotAcknowledged("no ack")
    assert w.packets.grab(7, ALICE).item_id == 701
    assert w.cache.rolled_back == [] and w.store.rolled == set()


@pytest.mark.parametrize(
    "failure", [RedisUnavailable("refused"), errors.ServiceUnavailable("cache"), errors.ChargeOutcomeUnknown("lost")]
)
def test_a_failed_credit_keeps_the_claim_is_counted_and_the_writer_goes_on_with_the_others(w, failure):
    w.store.add(7, "OPEN", [100, 200])
    w.ledger.recharge_error = failure
    report = w.persister.persist([claim(7, 701, ALICE, 100, grab_id=1), claim(7, 702, BOB, 200, grab_id=2)])
    assert report.applied == 2 and w.store.items[701].user_id == ALICE and w.store.items[702].user_id == BOB
    # one failed credit blocks no other (issue 19 item 7): both tried, both counted, the reconciler retries them
    assert len(w.ledger.recharges) == 2 and report.credit_failed == 2


def test_reading_a_packet_prefers_the_grabs_redis_knows_and_falls_back_to_the_db(w):
    w.store.add(7, "OPEN", [100, 200])
    w.store.items[701] = replace(w.store.items[701], user_id=BOB, claimed_at=NOW)
    w.cache.redis_grabs[7] = [(ALICE, 200), (BOB, 100)]
    assert w.packets.get(7).grabs == [(ALICE, 200), (BOB, 100)]
    del w.cache.redis_grabs[7]
    assert w.packets.get(7).grabs == [(BOB, 100)]
    with pytest.raises(errors.PacketNotFound):
        w.packets.get(8)


# the writer's persister ----------------------------------------------------------------------------------
def test_the_persister_stamps_fresh_claims_and_dead_letters_what_can_never_apply(w):
    w.store.add(7, "OPEN", [100, 200, 300, 400, 500])
    w.store.items[702] = replace(w.store.items[702], user_id=ALICE, claimed_at=NOW)  # this claim's replay
    w.store.items[703] = replace(w.store.items[703], user_id=BOB, claimed_at=NOW)  # went to someone else
    w.store.items[704] = replace(w.store.items[704], refunded=True)
    fresh, replay = claim(7, 701, ALICE, 100, grab_id=1), claim(7, 702, ALICE, 200, grab_id=2)
    taken, refunded = claim(7, 703, ALICE, 300, grab_id=3), claim(7, 704, ALICE, 400, grab_id=4)
    unknown, wrong_amount = claim(7, 799, ALICE, 100, grab_id=5), claim(7, 705, ALICE, 1, grab_id=6)
    other_packet = claim(8, 705, ALICE, 500, grab_id=7)
    report = w.persister.persist([fresh, replay, taken, refunded, unknown, wrong_amount, other_packet, fresh])
    assert (report.applied, report.duplicates, report.dead_lettered) == (1, 2, 5)
    assert (
        w.store.items[701].user_id == ALICE and w.store.items[703].user_id == BOB and w.store.items[705].user_id is None
    )
    reasons = {r.offset: r.error for r in w.outbox.dead}
    assert reasons == {
        703: "item already grabbed by another user or refunded",
        704: "item already grabbed by another user or refunded",
        799: "no such red packet item",
        705: "no such red packet item",
    }
    assert {r.topic for r in w.outbox.dead} == {REJECTED_TOPIC}
    assert w.cache.settled == [fresh, replay]  # persisted claims leave the pending hash, dead ones stay for a look
    # only the claim this commit stamped is credited: the replay was by its first delivery, the refused never
    assert w.ledger.recharges == [(ALICE, 100, "rp701")]


def test_the_persister_skips_a_grab_the_api_rolled_back_first(w):
    w.store.add(7, "OPEN", [100])
    w.outbox.rolled_back = {keys.packet_fate(7, 1)}
    report = w.persister.persist([claim(7, 701, ALICE, 100, grab_id=1)])
    assert (report.applied, report.rolled_back) == (0, 1) and w.store.items[701].user_id is None


def test_the_persister_skips_a_grab_the_db_rolled_back_whatever_redis_says_and_puts_it_back(w):
    """Redis lost the tombstone (or it expired before a replay): the claim succeeds, the DB's record decides."""
    w.store.add(7, "OPEN", [100, 200])
    w.store.rolled.add(1)
    report = w.persister.persist([claim(7, 701, ALICE, 100, grab_id=1), claim(7, 702, BOB, 200, grab_id=2)])
    assert (report.applied, report.rolled_back) == (1, 1)
    assert w.store.items[701].user_id is None and w.store.items[702].user_id == BOB
    assert w.cache.rolled_back == [(7, 1, 701, ALICE, 100)]


# expiry and the reconciler -------------------------------------------------------------------------------
def expired(claims_pending=0, hold_until=0):
    return ExpireReply(ExpireStatus.EXPIRED, claims_pending=claims_pending, hold_until=hold_until)


def test_creating_packets_are_finished_by_the_reconciler(w):
    w.store.add(7, "CREATING", [100, 200])
    w.store.add(8, "CREATING", [300])
    original = w.ledger.deduct

    def refuse_packet_8(user_id, amount, idem_key):
        if idem_key == "rp8":
            w.ledger.deducts.append((user_id, amount, idem_key))
            raise errors.InsufficientBalance("short")
        return original(user_id, amount, idem_key)

    w.ledger.deduct = refuse_packet_8
    report = w.reconciler.run(NOW, age_s=60)
    assert (report.opened, report.failed) == (1, 1)
    assert (w.store.state(7), w.store.state(8)) == ("OPEN", "FAILED")
    assert sorted(w.ledger.deducts) == [(SENDER, 300, "rp7"), (SENDER, 300, "rp8")]
    assert w.queue.offers == [(PACKET_EXPIRY, "7", NOW + 60_000, None)]


def test_a_failed_packet_whose_sender_was_debited_is_refunded_in_full_once_and_one_never_debited_is_left(w):
    w.store.add(7, "FAILED", [100, 200])
    w.store.add(8, "FAILED", [300])
    w.store.orders.add(("rp7", SENDER))  # the debit stood after all
    w.ledger.recharge_error = RedisUnavailable("refused")
    report = w.reconciler.run(NOW, age_s=60)
    assert report.failed_refunded == 0 and w.store.state(7) == "REFUNDING"  # the credit failed: paid by a later run
    w.ledger.recharge_error = None
    w.reconciler.run(NOW, age_s=60)
    calls = len(w.ledger.recharges)
    w.reconciler.run(NOW, age_s=60)
    assert len(w.ledger.recharges) == calls  # refunded: never again
    assert set(w.ledger.recharges) == {(SENDER, 300, "rprefund7")}  # every attempt under the same key: credited once
    assert (w.store.state(7), w.store.packets[7].refund) == ("REFUNDED", 300)
    assert all(w.store.items[i].refunded for i in (701, 702))
    assert w.store.state(8) == "FAILED" and w.store.packets[8].refund is None


def test_a_failed_packet_refunded_by_a_run_counts_once(w):
    w.store.add(7, "FAILED", [100, 200])
    w.store.orders.add(("rp7", SENDER))
    assert w.reconciler.run(NOW, age_s=60).failed_refunded == 1
    assert w.reconciler.run(NOW, age_s=60).failed_refunded == 0
    assert w.ledger.recharges == [(SENDER, 300, "rprefund7")] and w.store.state(7) == "REFUNDED"


def test_only_stale_pending_claims_are_compensated_through_the_persister(w):
    w.store.add(7, "OPEN", [100, 200])
    stale, recent = (
        claim(7, 701, ALICE, 100, grab_id=1, ts=NOW - 61_000),
        claim(7, 702, BOB, 200, grab_id=2, ts=NOW - 1000),
    )
    w.cache.pending[7] = [stale, recent]
    report = w.reconciler.run(NOW, age_s=60)
    assert report.compensated == 1
    assert (w.store.items[701].user_id, w.store.items[702].user_id) == (ALICE, None)


@pytest.mark.parametrize(
    "reply", [ExpireReply(ExpireStatus.OPEN), expired(claims_pending=1), expired(hold_until=NOW + 1)]
)
def test_no_refund_while_the_packet_is_open_or_a_claim_is_in_flight(w, reply):
    w.store.add(7, "OPEN", [100, 200])
    w.cache.expire_replies[7] = reply
    assert w.packets.expire(7, NOW) is Expiry.NOT_YET
    assert w.store.state(7) == "OPEN" and w.ledger.recharges == []


def test_an_expired_packet_refunds_its_unclaimed_rest_exactly_once(w):
    w.store.add(7, "OPEN", [100, 200, 300])
    w.store.items[702] = replace(w.store.items[702], user_id=ALICE, claimed_at=NOW - 1)
    w.cache.expire_replies[7] = expired()
    assert w.reconciler.run(NOW, age_s=60).refunded == 1
    assert w.packets.expire(7, NOW) is Expiry.SETTLED_BEFORE
    w.reconciler.run(NOW, age_s=60)
    assert w.ledger.recharges == [(SENDER, 400, "rprefund7")]
    assert w.store.state(7) == "REFUNDED" and w.store.packets[7].refund == 400 and w.cache.retired == [7]
    assert (w.store.items[701].refunded, w.store.items[702].refunded) == (True, False)


def test_a_refund_already_in_t_pay_is_not_paid_twice(w):
    w.store.add(7, "REFUNDING", [100, 200], refund=300)
    w.store.pay.add(("rprefund7", SENDER))
    assert w.reconciler.run(NOW, age_s=60).refunded == 1
    assert w.ledger.recharges == [] and w.store.state(7) == "REFUNDED"


def test_a_refund_whose_credit_failed_stays_refunding_and_the_next_run_pays_it_under_the_same_key(w):
    w.store.add(7, "OPEN", [100, 200])
    w.cache.expire_replies[7] = expired()
    w.ledger.recharge_error = RedisUnavailable("refused")
    assert w.packets.expire(7, NOW) is Expiry.REFUND_FAILED
    assert w.store.state(7) == "REFUNDING" and w.cache.retired == []
    w.ledger.recharge_error = None
    assert w.reconciler.run(NOW, age_s=60).refunded == 1
    assert w.ledger.recharges == [(SENDER, 300, "rprefund7")] * 2 and w.store.state(7) == "REFUNDED"


def test_the_expiry_handler_offers_an_unsettled_packet_again_later(w):
    w.store.add(7, "OPEN", [100])
    w.store.add(8, "OPEN", [100])
    w.cache.expire_replies = {7: expired(claims_pending=2), 8: expired()}
    w.packets.expire_due(["7", "8"])
    assert w.queue.offers == [(PACKET_EXPIRY, "7", None, EXPIRY_RETRY_MS)]
    assert (w.store.state(7), w.store.state(8)) == ("OPEN", "REFUNDED")


def test_an_expiring_packet_redis_lost_is_rebuilt_not_refunded(w):
    w.store.add(7, "OPEN", [100])
    w.cache.expire_replies[7] = ExpireReply(ExpireStatus.MISSING)
    report = w.reconciler.run(NOW, age_s=60)
    assert (report.rebuilt, report.refunded) == (1, 0)
    assert w.cache.loaded == [(7, "OPEN", NOW + HOLD_S * 1000, [701])] and w.store.state(7) == "OPEN"


def test_grabs_whose_credit_is_missing_are_credited_with_the_same_key_and_made_ones_only_marked(w):
    w.store.add(7, "OPEN", [100, 200, 300])
    for item_id, user in ((701, ALICE), (702, BOB), (703, SENDER)):
        w.store.items[item_id] = replace(w.store.items[item_id], user_id=user, claimed_at=NOW - 61_000)
    w.store.pay.add(("rp701", ALICE))  # credited by the writer after its commit
    report = w.reconciler.run(NOW, age_s=60)
    assert report.credited == 2
    assert sorted(w.ledger.recharges) == [(SENDER, 300, "rp703"), (BOB, 200, "rp702")]
    assert w.store.credited == {701}  # the others are marked once their t_pay row exists (a later run)
    w.reconciler.run(NOW, age_s=60)
    assert w.store.credited == {701, 702, 703} and len(w.ledger.recharges) == 2


def test_a_failing_credit_is_counted_and_the_reconciler_goes_on_with_the_next(w):
    w.store.add(7, "OPEN", [100, 200])
    for item_id, user in ((701, ALICE), (702, BOB)):
        w.store.items[item_id] = replace(w.store.items[item_id], user_id=user, claimed_at=NOW - 61_000)
    w.ledger.recharge_error = RedisUnavailable("refused")
    report = w.reconciler.run(NOW, age_s=60)
    assert (report.credited, report.credit_failed) == (0, 2)
    assert len(w.ledger.recharges) == 2
