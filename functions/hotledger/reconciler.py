"""Reconciler, run on a schedule.

Accounts are reconciled by ledger/reconcile.py (stale pending entries persisted, caches behind the DB
corrected or evicted); the report counts the pending entries and their oldest age. Vouchers and red packets are
reconciled by vouchers/reconcile.py and redpackets/reconcile.py; unfinished journeys become inbox reminders
(notices/journeys.py); order-close reminders Redis lost are offered again and orders past their close time
closed (notices/payment_orders.py).

Bounded work: each part runs with its own budget (part_items items or part_s seconds, whichever comes first), so
a run ends well within the function's timeout however many accounts, vouchers or packets there are, and one part
cannot starve the ones after it. A part that runs out stops at a page boundary; where it stopped is kept in Redis
(dal.cursor) and the next run continues after it, so every item is visited within a bounded number of runs. A
part that raises is logged and named in `failed_parts`; the others run all the same (a Redis or DB outage
fails each part on its own and the next run tries again).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from hotledger.dal.budget import Budget
from hotledger.ledger.reconcile import AccountsReconcileReport, LedgerReconcile
from hotledger.notices.journeys import JourneyScanReport
from hotledger.outbox.writer import Writer
from hotledger.redpackets.reconcile import PacketReconciler, PacketReconcileReport
from hotledger.vouchers.reconcile import VoucherReconciler, VoucherReconcileReport

log = logging.getLogger(__name__)

PARTS = ("accounts", "vouchers", "packets", "journeys", "reminders", "orders", "keys")


@dataclass
class ReconcileReport(AccountsReconcileReport):
    vouchers: VoucherReconcileReport = field(default_factory=VoucherReconcileReport)
    packets: PacketReconcileReport = field(default_factory=PacketReconcileReport)
    journeys: JourneyScanReport = field(default_factory=JourneyScanReport)
    reminders_reoffered: int = 0
    orders_closed: int = 0
    keys_pruned: int = 0  # key and rollback records past KEY_RETENTION_DAYS deleted this run
    reminders_next_after: int = 0  # the payment order the next run's reminders part continues after; 0: it reached the last
    failed_parts: list[str] = field(default_factory=list)  # parts that raised this run (logged with the error)
    part_seconds: dict[str, float] = field(default_factory=dict)  # how long each part took


class Reconciler:
    def __init__(self, accounts: LedgerReconcile, writer: Writer, age_s: int, vouchers: VoucherReconciler,
                 redpackets: PacketReconciler, journeys, payment_orders, cursors=None, part_items: int = 2**62,
                 part_s: float = 10.0**9, clock: Callable[[], float] = time.monotonic,
                 prune_keys: Callable[[int, Budget], dict[str, int]] | None = None, key_retention_ms: int = 0):
        """prune_keys(older_than_ms, budget): deletes key and rollback records past their retention (dal/retention.py)."""
        self.accounts, self.writer, self.age_s = accounts, writer, age_s
        self.prune_keys, self.key_retention_ms = prune_keys, key_retention_ms
        self.vouchers, self.redpackets, self.journeys, self.payment_orders = vouchers, redpackets, journeys, payment_orders
        self.cursors, self.part_items, self.part_s, self.clock = cursors, part_items, part_s, clock

    def run(self, now_ms: int) -> ReconcileReport:
        report = ReconcileReport()

        def accounts(budget: Budget) -> None:
            done = self.accounts.run(now_ms, self.age_s, budget, self._cursor("accounts"))
            for name, value in asdict(done).items():
                setattr(report, name, value)
            self._save("accounts", done.next_after)

        def vouchers(budget: Budget) -> None:
            report.vouchers = self.vouchers.run(now_ms, self.age_s, budget, self._cursor("vouchers"))
            self._save("vouchers", report.vouchers.next_after)

        def packets(budget: Budget) -> None:
            report.packets = self.redpackets.run(now_ms, self.age_s, budget, self._cursor("packets"))
            self._save("packets", report.packets.next_after)

        def journeys(budget: Budget) -> None:
            report.journeys = self.journeys.scan(now_ms)  # one page per journey kind: bounded already

        def reminders(budget: Budget) -> None:
            report.reminders_reoffered, report.reminders_next_after = self.payment_orders.reoffer_lost_reminders_within(
                now_ms, budget, self._cursor("reminders"))
            self._save("reminders", report.reminders_next_after)

        def orders(budget: Budget) -> None:
            report.orders_closed = self.payment_orders.close_overdue(now_ms)  # one page: bounded already

        def keys(budget: Budget) -> None:
            if self.prune_keys is not None:
                report.keys_pruned = sum(self.prune_keys(now_ms - self.key_retention_ms, budget).values())

        for name, part in zip(PARTS, (accounts, vouchers, packets, journeys, reminders, orders, keys)):
            self._part(name, part, report)
        return report

    def _part(self, name: str, part: Callable[[Budget], None], report: ReconcileReport) -> None:
        started = self.clock()
        try:
            part(Budget(self.part_items, self.part_s, self.clock))
        except Exception:  # this part alone failed this run: the others go on, the next run tries it again
            log.exception("reconciler part failed; the other parts go on", extra={"part": name})
            report.failed_parts.append(name)
        report.part_seconds[name] = round(self.clock() - started, 3)

    def _cursor(self, part: str) -> int:
        return self.cursors.get(part) if self.cursors is not None else 0

    def _save(self, part: str, after: int) -> None:
        if self.cursors is not None:
            self.cursors.set(part, after)
