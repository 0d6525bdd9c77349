"""The transfers' part of the scheduled reconciler: it finishes what a crash (a request that died, a transfer-post
element lost) left between legs. Every step repeats safely: the legs are charged under the transfer's own keys."""

from __future__ import annotations

from dataclasses import dataclass

from hotledger import observability
from hotledger.transfers.rows import CREDITED, DEBITED, PENDING, RELEASING
from hotledger.transfers.service import LEDGER_FAILURES, Transfers
from hotledger.transfers.store import TransferStore

logger = observability.logger()
PAGE = 500


@dataclass
class TransferReconcileReport:
    advanced: int = 0  # PENDING, DEBITED or RELEASING transfers older than RECONCILE_AGE_S moved on
    stuck: int = 0  # of those, still not final (the ledger refused for now, or is down): next run
    posted: int = 0  # CREDITED transfers whose legs are both booked now
    released: int = 0  # FAILED transfers whose payer was debited after all, given back now


class TransferReconciler:
    def __init__(self, transfers: Transfers, store: TransferStore):
        self.transfers, self.store = transfers, store

    def run(self, now_ms: int, age_s: int) -> TransferReconcileReport:
        report = TransferReconcileReport()
        # a transfer is taken over from its request only once the request cannot be charging a leg any more
        cutoff = now_ms - max(age_s * 1000, self.transfers.takeover_ms)
        for state in (PENDING, DEBITED, RELEASING):
            for row in self.store.in_state(state, cutoff, PAGE):
                try:
                    moved = self.transfers.advance(row)
                except LEDGER_FAILURES as exc:
                    logger.warning("transfer stuck", extra={"transfer_id": row.transfer_id, "error": str(exc)})
                    report.stuck += 1
                    continue
                report.advanced += 1
                report.stuck += moved.state in (PENDING, DEBITED, RELEASING)
        for row in self.store.in_state(CREDITED, now_ms + 1, PAGE):
            report.posted += self.transfers.advance(row).state != CREDITED
        for row in self.store.failed_with_debit(PAGE):
            report.released += self.transfers.release_failed_debit(row)
        return report
