"""Red packet claims -> t_red_packet_item (the writer's red packet persister), exactly once.

One transaction per batch: each claim's fate is claimed first (a grab the API rolled back is skipped), the
packets are share-locked (ordering the commit against a rebuild, see PacketTx.lock_for_claims) and the
claimed items locked; a grab the DB recorded as rolled back (t_rolled_back, by the API under the same locks) is
skipped and put back in Redis; then each claim is judged against its item's row:
- the item already holds this user: a replay, nothing to write (but its Redis side is settled again);
- no such item, or one of another packet or amount: dead-lettered, it can never apply;
- the item holds another user, or was refunded: dead-lettered (the item went elsewhere first);
- otherwise the item is stamped with its grabber, all fresh items in one statement.
After the commit the persisted claims leave the packets' pending hashes in Redis and each fresh claim's grabber
is credited (credit_key, once): only now, so a claim the DB refused is never paid. A crash or a ledger failure
between the commit and a credit leaves it to the reconciler (claimed items not in t_pay are credited there).
"""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from hotledger import keys
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, dedupe_and_claim, isolating_refusals, rejected
from hotledger.redpackets.store import ItemRow, PacketCache, PacketStore


class Verdict(Enum):
    FRESH = "fresh"
    DUPLICATE = "duplicate"
    UNKNOWN_ITEM = "no such red packet item"
    TAKEN = "item already grabbed by another user or refunded"


def verdict(claim: RedPacketClaimEvent, item: ItemRow | None) -> Verdict:
    """What a claim is, against its item's locked row (None: the DB has no such item)."""
    if item is None or item.packet_id != claim.packet_id or item.amount != claim.amount:
        return Verdict.UNKNOWN_ITEM
    if item.user_id == claim.user_id:
        return Verdict.DUPLICATE
    if item.user_id is not None or item.refunded:
        return Verdict.TAKEN
    return Verdict.FRESH


class RedPacketPersister:
    def __init__(self, store: PacketStore, cache: PacketCache, outbox: OutboxStore, credit: Callable[[int, int, int], bool],
                 undo_grab: Callable[[int, int, int, int, int], bool]):
        """credit(user id, item id, amount): the grabber's credit through the ledger, False when it failed.
        undo_grab(packet id, grab id, item id, user id, amount): takes a grab back (RedPackets.undo_grab), for a claim
        the DB refuses for its data: it can never be stamped, so it is recorded rolled back and its item put back."""
        self.store, self.cache, self.outbox, self.credit, self.undo_grab = store, cache, outbox, credit, undo_grab

    @isolating_refusals(lambda e: (f"rp{e.packet_id}", e.item_id),
                        settle_refused=lambda self, e: self.undo_grab(e.packet_id, e.grab_id, e.item_id, e.user_id, e.amount))
    def persist(self, events: list[RedPacketClaimEvent]) -> PersistReport:
        report = PersistReport()
        claimed, report.duplicates, report.rolled_back = dedupe_and_claim(
            self.outbox, events, lambda e: e.grab_id, lambda e: e.packet_id, lambda p, e: keys.packet_fate(p, e.grab_id))
        fresh, replayed, dead = [], [], []
        with self.store.transaction() as tx:
            items = tx.lock_for_claims([e.packet_id for e in claimed], [e.item_id for e in claimed])
            # rolled back for good in the DB (under the item locks the API records it under): skipped whatever
            # Redis says (its tombstone lost, or expired before a replay)
            undone = tx.rolled_back([e.grab_id for e in claimed])
            given_back = [e for e in claimed if e.grab_id in undone]
            claimed = [e for e in claimed if e.grab_id not in undone]
            report.rolled_back += len(given_back)
            for e in claimed:
                judged = verdict(e, items.get(e.item_id))
                if judged is Verdict.FRESH:
                    fresh.append(e)
                elif judged is Verdict.DUPLICATE:
                    replayed.append(e)
                else:
                    dead.append(rejected(f"rp{e.packet_id}", e.item_id, e, judged.value))
                    report.late_refused += judged is Verdict.TAKEN
            tx.stamp_claims(fresh)
            report.dead_lettered = self.outbox.dead_letter(tx.cursor, dead)
        report.applied = len(fresh)
        report.duplicates += len(replayed)
        self.cache.settle([*fresh, *replayed])
        for e in given_back:  # rare: the API's own put-back did not run (or has not yet); it is idempotent
            self.cache.rollback(e.packet_id, e.grab_id, e.item_id, e.user_id, e.amount)
        for e in fresh:  # a failed credit (refused, or the ledger down) is the reconciler's; the others go on
            report.credit_failed += not self.credit(e.user_id, e.item_id, e.amount)
        return report
