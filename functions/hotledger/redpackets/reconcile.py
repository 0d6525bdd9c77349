"""The red packets' part of the scheduled reconciler: it finishes what a crash (or a lost event, or a failed
ledger call) left half done. Every step repeats safely: money moves under the same Idempotency-Keys as the
first attempt, and claims go through the writer's exactly-once persister.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotledger import errors, observability
from hotledger.dal.budget import Budget
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.redpackets.persist import RedPacketPersister
from hotledger.redpackets.service import Expiry, RedPackets
from hotledger.redpackets.store import PacketStore

logger = observability.logger()

PAGE = 500


@dataclass
class PacketReconcileReport:
    opened: int = 0  # CREATING packets whose debit went through now (or had before the crash)
    failed: int = 0  # CREATING packets whose debit was refused (now FAILED) or is still unknown
    failed_refunded: int = 0  # FAILED packets whose sender was debited after all, refunded in full now
    compensated: int = 0  # claims whose event was lost, persisted from Redis
    dead_lettered: int = 0  # of those, claims the DB refused (set aside with the reason; they stay pending in Redis)
    credited: int = 0  # grabs whose credit was missing, credited now
    credit_failed: int = 0  # credits tried and failed this run (refused, or the ledger down): retried next run
    refunded: int = 0  # refunds finished
    rebuilt: int = 0  # expired packets Redis had lost, rebuilt
    next_after: int = 0  # the OPEN packet id the next run continues after; 0: this run reached the last one


class PacketReconciler:
    def __init__(self, packets: RedPackets, persister: RedPacketPersister, store: PacketStore):
        self.packets, self.persister, self.store = packets, persister, store

    def run(self, now_ms: int, age_s: int, budget: Budget | None = None, after: int = 0) -> PacketReconcileReport:
        """One pass; what is younger than age_s may still be finished by its own request or event, so it is
        left alone. Per pass:
        - a packet CREATING for longer: its debit is run again (same key), opening it or marking it FAILED (only
          on a definitive refusal; an unknown outcome leaves it CREATING for the next pass);
        - a FAILED packet whose debit the ledger holds after all: refunded in full (REFUNDING, then the refund
          credit under rprefund<id>, once);
        - an OPEN packet's claims pending for longer: persisted from Redis (their event was lost); then the
          packet is expired and refunded if due (Expiry: only once no claim is in flight); OPEN packets are taken
          in id order after `after`, in pages, while `budget` lasts (the other steps take one page each);
        - a REFUNDING packet: its refund credit is made (once: t_pay is checked for the key first);
        - a grab persisted for longer whose credit is not marked: marked when t_pay has it, credited again
          (same key) when not; the first failing credit ends this step (the ledger is down: one failed call
          per pass, not hundreds)."""
        report = PacketReconcileReport()
        cutoff = now_ms - age_s * 1000
        for packet in self.store.creating(cutoff, PAGE):
            try:
                self.packets.debit_and_open(packet)
                report.opened += 1
            except (errors.DomainError, RedisUnavailable, DatabaseUnavailable):
                report.failed += 1
        for packet_id in self.store.failed_with_debit(PAGE):
            report.failed_refunded += self.packets.refund_failed_debit(packet_id)
        budget = budget or Budget.unlimited()
        report.next_after = after
        while not budget.exhausted:
            open_ids = self.store.open_ids(report.next_after, budget.page(PAGE))
            if not open_ids:
                report.next_after = 0
                break
            for packet_id in open_ids:
                self._open_packet(packet_id, cutoff, now_ms, report)
            budget.spend(len(open_ids))
            report.next_after = open_ids[-1]
        for packet_id in self.store.refunding_ids(PAGE):
            report.refunded += self.packets.finish_refund(packet_id)
        self._credit_grabbers(cutoff, report)
        return report

    def _open_packet(self, packet_id: int, cutoff: int, now_ms: int, report: PacketReconcileReport) -> None:
        stale = [c for c in self.packets.pending_claims(packet_id) if c.ts < cutoff]
        if stale:  # a claim the DB refuses is dead-lettered by the persister, never fails the run
            persisted = self.persister.persist(stale)
            report.compensated += persisted.applied
            report.dead_lettered += persisted.dead_lettered
        expiry = self.packets.expire(packet_id, now_ms)
        report.rebuilt += expiry is Expiry.REBUILT
        report.refunded += expiry is Expiry.REFUNDED

    def _credit_grabbers(self, claimed_before: int, report: PacketReconcileReport) -> None:
        claims = self.store.uncredited_claims(claimed_before, PAGE)
        self.store.mark_credited([c.item_id for c in claims if c.in_ledger])
        for claim in claims:
            if claim.in_ledger:
                continue
            if self.packets.credit_grab(claim.user_id, claim.item_id, claim.amount):
                report.credited += 1
            else:  # one grabber's refused credit (at the balance limit, say) must not hold up the others
                report.credit_failed += 1
                logger.warning("grab credit failed", extra={"item_id": claim.item_id, "user_id": claim.user_id})
