"""The writer's routing of events to their feature's persister, and the dedupe-and-claim step every persister takes."""
from __future__ import annotations

from hotledger import keys
from hotledger.outbox.events import LedgerEvent, RedPacketClaimEvent, VoucherOrderEvent
from hotledger.outbox.writer import PersistReport, Writer, dedupe_and_claim


class FakeOutbox:
    def __init__(self, rolled_back=frozenset()):
        self.rolled_back, self.claims = rolled_back, []

    def claim(self, groups):
        self.claims.append(groups)
        return [[key not in self.rolled_back for key in group] for group in groups]


class RecordingPersister:
    def __init__(self, flagged=()):
        self.batches, self.flagged = [], list(flagged)

    def persist(self, events):
        self.batches.append(events)
        return PersistReport(applied=len(events), duplicates=1, flagged_accounts=self.flagged)


def ledger_event(entry_id, user_id=7):
    return LedgerEvent(type="ledger", id=entry_id, kind="D", user_id=user_id, amount=100, balance_after=900, version=2,
                       epoch="e", ts=1, open="1")


def voucher_event(order_id):
    return VoucherOrderEvent(type="voucher_order", id=order_id, voucher_id=3, user_id=7, seq=1, ts=1, epoch="e")


def packet_event(grab_id):
    return RedPacketClaimEvent(type="redpacket_claim", packet_id=4, item_id=grab_id, user_id=7, amount=10, ts=1, grab_id=grab_id)


def test_each_event_type_goes_to_its_persister_in_its_order_and_the_reports_add_up():
    ledger, vouchers, packets = RecordingPersister(flagged=[7]), RecordingPersister(), RecordingPersister()
    writer = Writer({LedgerEvent: ledger, VoucherOrderEvent: vouchers, RedPacketClaimEvent: packets}, FakeOutbox())
    batch = [ledger_event(1), voucher_event(2), ledger_event(3), packet_event(4)]
    report = writer.persist(batch)
    assert ledger.batches == [[batch[0], batch[2]]] and vouchers.batches == [[batch[1]]] and packets.batches == [[batch[3]]]
    assert (report.applied, report.duplicates, report.flagged_accounts) == (4, 3, [7])


def test_a_type_without_events_in_the_batch_is_not_called():
    ledger, vouchers = RecordingPersister(), RecordingPersister()
    Writer({LedgerEvent: ledger, VoucherOrderEvent: vouchers}, FakeOutbox()).persist([voucher_event(1)])
    assert ledger.batches == [] and len(vouchers.batches) == 1


def test_dedupe_and_claim_drops_repeats_claims_per_slot_and_skips_what_the_api_rolled_back():
    outbox = FakeOutbox(rolled_back={keys.fate(8, 3)})
    events = [ledger_event(1), ledger_event(2), ledger_event(1), ledger_event(3, user_id=8), ledger_event(4, user_id=8)]
    claimed, repeats, rolled_back = dedupe_and_claim(
        outbox, events, lambda e: e.id, lambda e: e.user_id, lambda user_id, e: keys.fate(user_id, e.id))
    assert [e.id for e in claimed] == [1, 2, 4] and (repeats, rolled_back) == (1, 1)
    assert outbox.claims == [[[keys.fate(7, 1), keys.fate(7, 2)], [keys.fate(8, 3), keys.fate(8, 4)]]]  # one claim per slot


def test_dedupe_and_claim_with_nothing_to_claim():
    assert dedupe_and_claim(FakeOutbox(), [], lambda e: e.id, lambda e: e.user_id, lambda u, e: "") == ([], 0, 0)
