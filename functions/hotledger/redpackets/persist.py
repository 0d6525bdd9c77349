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
from contextlib import AbstractContextManager
from enum import Enum

from hotledger import keys
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.outbox.persister import BatchPersister, Judged
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, dedupe_and_claim
from hotledger.redpackets.rows import ItemRow
from hotledger.redpackets.store import PacketCache, PacketStore
from hotledger.redpackets.tx import PacketTx


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


class RedPacketPersister(BatchPersister[RedPacketClaimEvent]):
    """The template's steps for red packet claims (outbox/persister.py), with the grabbers' credits after the commit."""

    def __init__(
        self,
        store: PacketStore,
        cache: PacketCache,
        outbox: OutboxStore,
        credit: Callable[[int, int, int], bool],
        undo_grab: Callable[[int, int, int, int, int], bool],
    ):
        """credit(user id, item id, amount): the grabber's credit through the ledger, False when it failed.
        undo_grab(packet id, grab id, item id, user id, amount): takes a grab back (RedPackets.undo_grab), for a claim
        the DB refuses for its data: it can never be stamped, so it is recorded rolled back and its item put back."""
        self.store, self.cache, self.outbox, self.credit, self.undo_grab = store, cache, outbox, credit, undo_grab

    def claim(self, events: list[RedPacketClaimEvent], report: PersistReport) -> list[RedPacketClaimEvent]:
        claimed, report.duplicates, report.rolled_back = dedupe_and_claim(
            self.outbox, events, lambda e: e.grab_id, lambda e: e.packet_id, lambda p, e: keys.packet_fate(p, e.grab_id)
        )
        return claimed

    def transaction(self) -> AbstractContextManager[PacketTx]:
        return self.store.transaction()

    def lock(self, tx: PacketTx, events: list[RedPacketClaimEvent]) -> dict[int, ItemRow]:
        return tx.lock_for_claims([e.packet_id for e in events], [e.item_id for e in events])

    def rolled_back(self, tx: PacketTx, locked: dict[int, ItemRow], events: list[RedPacketClaimEvent]) -> set[int]:
        return tx.rolled_back([e.grab_id for e in events])

    def judge(
        self, tx: PacketTx, locked: dict[int, ItemRow], events: list[RedPacketClaimEvent]
    ) -> Judged[RedPacketClaimEvent]:
        judged: Judged[RedPacketClaimEvent] = Judged()
        items = dict(locked)  # as this batch leaves them: a second claim of an item is judged against the first
        for e in events:
            found = verdict(e, items.get(e.item_id))
            if found is Verdict.FRESH:
                judged.fresh.append(e)
                items[e.item_id] = ItemRow(e.item_id, e.packet_id, e.amount, e.user_id, e.ts)
            elif found is Verdict.DUPLICATE:
                judged.replayed.append(e)
            else:
                judged.dead.append((e, found.value))
                judged.late += found is Verdict.TAKEN
        return judged

    def write(self, tx: PacketTx, locked: dict[int, ItemRow], fresh: list[RedPacketClaimEvent]) -> None:
        tx.stamp_claims(fresh)

    def settle(self, locked: dict[int, ItemRow], judged: Judged[RedPacketClaimEvent], report: PersistReport) -> None:
        self.cache.settle([*judged.fresh, *judged.replayed])

    def give_back(self, e: RedPacketClaimEvent) -> None:
        self.cache.rollback(e.packet_id, e.grab_id, e.item_id, e.user_id, e.amount)

    def settle_refused(self, e: RedPacketClaimEvent) -> None:
        self.undo_grab(e.packet_id, e.grab_id, e.item_id, e.user_id, e.amount)

    def after_commit(self, judged: Judged[RedPacketClaimEvent], report: PersistReport) -> None:
        for e in judged.fresh:  # a failed credit (refused, or the ledger down) is the reconciler's; the others go on
            report.credit_failed += not self.credit(e.user_id, e.item_id, e.amount)

    def id_of(self, e: RedPacketClaimEvent) -> int:
        return e.grab_id

    def dead_letter_id(self, e: RedPacketClaimEvent) -> tuple[str, int]:
        return f"rp{e.packet_id}", e.item_id
