"""The writer's routing of events to their feature's persister, the dedupe-and-claim step every persister takes,
and the isolation of records the DB refuses (bisecting a failed batch)."""

from __future__ import annotations

import contextlib

import pymysql
import pytest

from fakes import FakeOutbox
from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.outbox.events import LedgerEvent, RedPacketClaimEvent, VoucherOrderEvent
from hotledger.outbox.writer import REJECTED_TOPIC, PersistReport, Writer, dedupe_and_claim, persist_isolating, rejected


class RecordingPersister:
    def __init__(self, flagged=()):
        self.batches, self.flagged = [], list(flagged)

    def persist(self, events):
        self.batches.append(events)
        return PersistReport(applied=len(events), duplicates=1, flagged_accounts=self.flagged)


def ledger_event(entry_id, user_id=7):
    return LedgerEvent(
        type="ledger",
        id=entry_id,
        kind="D",
        user_id=user_id,
        amount=100,
        balance_after=900,
        version=2,
        epoch="e",
        ts=1,
        open="1",
    )


def voucher_event(order_id):
    return VoucherOrderEvent(type="voucher_order", id=order_id, voucher_id=3, user_id=7, seq=1, ts=1, epoch="e")


def packet_event(grab_id):
    return RedPacketClaimEvent(
        type="redpacket_claim", packet_id=4, item_id=grab_id, user_id=7, amount=10, ts=1, grab_id=grab_id
    )


def test_each_event_type_goes_to_its_persister_in_its_order_and_the_reports_add_up():
    ledger, vouchers, packets = RecordingPersister(flagged=[7]), RecordingPersister(), RecordingPersister()
    writer = Writer({LedgerEvent: ledger, VoucherOrderEvent: vouchers, RedPacketClaimEvent: packets}, FakeOutbox())
    batch = [ledger_event(1), voucher_event(2), ledger_event(3), packet_event(4)]
    report = writer.persist(batch)
    assert (
        ledger.batches == [[batch[0], batch[2]]]
        and vouchers.batches == [[batch[1]]]
        and packets.batches == [[batch[3]]]
    )
    assert (report.applied, report.duplicates, report.flagged_accounts) == (4, 3, [7])


def test_a_type_without_events_in_the_batch_is_not_called():
    ledger, vouchers = RecordingPersister(), RecordingPersister()
    Writer({LedgerEvent: ledger, VoucherOrderEvent: vouchers}, FakeOutbox()).persist([voucher_event(1)])
    assert ledger.batches == [] and len(vouchers.batches) == 1


def test_dedupe_and_claim_drops_repeats_claims_per_slot_and_skips_what_the_api_rolled_back():
    outbox = FakeOutbox(rolled_back={keys.fate(8, 3)})
    events = [ledger_event(1), ledger_event(2), ledger_event(1), ledger_event(3, user_id=8), ledger_event(4, user_id=8)]
    claimed, repeats, rolled_back = dedupe_and_claim(
        outbox, events, lambda e: e.id, lambda e: e.user_id, lambda user_id, e: keys.fate(user_id, e.id)
    )
    assert [e.id for e in claimed] == [1, 2, 4] and (repeats, rolled_back) == (1, 1)
    assert outbox.claims == [
        [[keys.fate(7, 1), keys.fate(7, 2)], [keys.fate(8, 3), keys.fate(8, 4)]]
    ]  # one claim per slot


def test_dedupe_and_claim_with_nothing_to_claim():
    assert dedupe_and_claim(FakeOutbox(), [], lambda e: e.id, lambda e: e.user_id, lambda u, e: "") == ([], 0, 0)


# records the DB refuses ---------------------------------------------------------------------------------------
UNIQUE = pymysql.err.IntegrityError(1062, "Duplicate entry '4-7' for key 'uk_packet_user'")


class RefusingPersister:
    """Fails a whole batch, as one transaction does, when it holds a record in `refused`; applies it otherwise."""

    def __init__(self, refused=(), failure=UNIQUE):
        self.outbox, self.refused, self.failure = FakeOutbox(), set(refused), failure
        self.applied, self.calls = [], 0

    def persist(self, events):
        return persist_isolating(
            self._attempt, events, lambda e, why: rejected(str(e.user_id), e.id, e, why), self.outbox, lambda e: None
        )

    def _attempt(self, events):
        self.calls += 1
        if any(e.id in self.refused for e in events):
            raise self.failure
        self.applied += [e.id for e in events]
        return PersistReport(applied=len(events))


def test_a_record_the_db_refuses_is_dead_lettered_with_the_reason_and_the_rest_applied_once():
    persister = RefusingPersister(refused={6})
    report = persister.persist([ledger_event(i) for i in range(1, 17)])
    assert sorted(persister.applied) == [i for i in range(1, 17) if i != 6]  # each once
    assert (report.applied, report.dead_lettered) == (15, 1)
    ((dead),) = persister.outbox.dead
    assert (dead.topic, dead.offset, dead.key) == (REJECTED_TOPIC, 6, b"7")
    assert dead.error == "the DB refused the record: (1062) Duplicate entry '4-7' for key 'uk_packet_user'"
    assert persister.calls <= 1 + 2 * 4  # bisected: the failed batch, then two halves per level, not one call a record


def test_every_refused_record_of_a_batch_is_set_aside_and_a_clean_batch_is_one_call():
    persister = RefusingPersister(refused={1, 5, 8})
    report = persister.persist([ledger_event(i) for i in range(1, 9)])
    assert sorted(persister.applied) == [2, 3, 4, 6, 7] and sorted(d.offset for d in persister.outbox.dead) == [1, 5, 8]
    assert (report.applied, report.dead_lettered) == (5, 3)
    clean = RefusingPersister()
    assert clean.persist([ledger_event(i) for i in range(1, 9)]).applied == 8 and clean.calls == 1


@pytest.mark.parametrize(
    "failure",
    [
        db.DatabaseUnavailable("(2013, 'Lost connection')"),  # transient: connection, lock wait, deadlock
        RedisUnavailable("refused"),
        pymysql.err.ProgrammingError(
            1064, "You have an error in your SQL syntax"
        ),  # a fault in the code, not the record
    ],
)
def test_a_failure_other_than_a_refusal_of_the_data_fails_the_whole_batch_and_sets_nothing_aside(failure):
    persister = RefusingPersister(refused={3}, failure=failure)
    with pytest.raises(type(failure)):
        persister.persist([ledger_event(i) for i in range(1, 5)])
    assert persister.outbox.dead == [] and persister.applied == [] and persister.calls == 1


@pytest.mark.parametrize(
    "exc, refused",
    [
        (pymysql.err.IntegrityError(1062, "Duplicate entry"), True),
        (pymysql.err.IntegrityError(1048, "Column 'user_id' cannot be null"), True),
        (pymysql.err.DataError(1264, "Out of range value for column 'amount'"), True),
        (pymysql.err.OperationalError(1690, "BIGINT value is out of range"), True),
        (pymysql.err.OperationalError(4025, "CONSTRAINT `chk_stock` failed"), True),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), False),
        (pymysql.err.OperationalError(1213, "Deadlock found"), False),
        (pymysql.err.OperationalError(2013, "Lost connection"), False),
        (pymysql.err.InterfaceError(0, ""), False),
        (pymysql.err.ProgrammingError(1146, "Table doesn't exist"), False),
        (db.DatabaseUnavailable("down"), False),
        (ValueError("bug"), False),
    ],
)
def test_db_tells_a_refusal_of_the_data_from_a_transient_failure_or_a_bug(exc, refused):
    assert (db.refused(exc) is not None) is refused


class FakeConnection:
    def __init__(self, failure):
        self.failure, self.rolled_back, self.committed = failure, False, False

    def begin(self):
        pass

    @contextlib.contextmanager
    def cursor(self):
        yield self

    def execute(self, *_):
        raise self.failure

    def rollback(self):
        self.rolled_back = True

    def commit(self):
        self.committed = True

    def close(self):
        pass


@pytest.mark.parametrize(
    "failure, raised",
    [
        (pymysql.err.OperationalError(1690, "BIGINT UNSIGNED value is out of range"), pymysql.err.OperationalError),
        (pymysql.err.OperationalError(1213, "Deadlock found"), db.DatabaseUnavailable),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), db.DatabaseUnavailable),
    ],
)
def test_a_transaction_raises_a_refusal_as_it_is_and_a_transient_failure_as_database_unavailable(
    monkeypatch, failure, raised
):
    conn = FakeConnection(failure)
    monkeypatch.setattr(db, "connection", lambda: conn)
    with pytest.raises(raised) as caught, db.transaction() as cur:
        cur.execute("UPDATE t_account SET balance = balance + 1")
    assert caught.type is raised and not conn.committed
    assert conn.rolled_back is (raised is not db.DatabaseUnavailable)  # a transient failure drops the connection
