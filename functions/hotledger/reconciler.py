"""Reconciler, run on a schedule.

Accounts are reconciled by ledger/reconcile.py (stale pending entries persisted, caches behind the DB
corrected or evicted); the report counts the pending entries and their oldest age. Vouchers and red packets are
reconciled by vouchers/reconcile.py and redpackets/reconcile.py; unfinished journeys become inbox reminders
(logic/journeys.py); order-close reminders Redis lost are offered again and orders past their close time
closed (logic/orders.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hotledger.ledger.reconcile import AccountsReconcileReport, LedgerReconcile
from hotledger.notices.journeys import JourneyScanReport
from hotledger.outbox.writer import Writer
from hotledger.redpackets.reconcile import PacketReconciler, PacketReconcileReport
from hotledger.vouchers.reconcile import VoucherReconciler, VoucherReconcileReport


@dataclass
class ReconcileReport(AccountsReconcileReport):
    vouchers: VoucherReconcileReport = field(default_factory=VoucherReconcileReport)
    packets: PacketReconcileReport = field(default_factory=PacketReconcileReport)
    journeys: JourneyScanReport = field(default_factory=JourneyScanReport)
    reminders_reoffered: int = 0
    orders_closed: int = 0


class Reconciler:
    def __init__(self, accounts: LedgerReconcile, writer: Writer, age_s: int, vouchers: VoucherReconciler,
                 redpackets: PacketReconciler, journeys, payment_orders):
        self.accounts, self.writer, self.age_s = accounts, writer, age_s
        self.vouchers, self.redpackets, self.journeys, self.payment_orders = vouchers, redpackets, journeys, payment_orders

    def run(self, now_ms: int) -> ReconcileReport:
        report = ReconcileReport(**asdict(self.accounts.run(now_ms, self.age_s)))
        report.vouchers = self.vouchers.run(now_ms, self.age_s)
        report.packets = self.redpackets.run(now_ms, self.age_s)
        report.journeys = self.journeys.scan(now_ms)
        report.reminders_reoffered = self.payment_orders.reoffer_lost_reminders(now_ms)
        report.orders_closed = self.payment_orders.close_overdue(now_ms)
        return report
