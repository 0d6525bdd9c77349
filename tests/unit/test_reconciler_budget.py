"""The reconciler's bounded work (issue 10, item 14): budgets, cursors kept between runs, parts isolated from each
other's failures. No server: the parts and the cursor store are fakes."""

from types import SimpleNamespace

from hotledger.dal.budget import Budget
from hotledger.ledger.reconcile import AccountsReconcileReport, LedgerReconcile
from hotledger.ledger.rows import AccountBalance, CacheState
from hotledger.notices.journeys import JourneyScanReport
from hotledger.reconciler import Reconciler
from hotledger.redpackets.reconcile import PacketReconcileReport
from hotledger.vouchers.reconcile import VoucherReconcileReport


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_budget_runs_out_by_items_or_by_time():
    clock = Clock()
    budget = Budget(5, 2.0, clock)
    assert budget.page(500) == 5 and not budget.exhausted
    budget.spend(3)
    assert budget.page(500) == 2
    clock.now = 2.0
    assert budget.exhausted
    assert Budget(0, 9.0, clock).exhausted


class SlowAccounts:
    """Accounts 1..n with no cache; each page takes a second."""

    def __init__(self, n, clock):
        self.ids, self.clock, self.pages = list(range(1, n + 1)), clock, []

    def accounts_after(self, user_id, limit):
        self.clock.now += 1.0
        page = [i for i in self.ids if i > user_id][:limit]
        self.pages.append(page)
        return [AccountBalance(i, "ASYNC", 0, 1) for i in page]

    def cache_states(self, user_ids, stale_before_ms, limit):
        return [CacheState(None, None, False, 0, None, []) for _ in user_ids]


def test_the_accounts_part_stops_when_its_time_runs_out_and_the_next_run_continues_after_it():
    clock = Clock()
    store = SlowAccounts(10, clock)
    reconcile = LedgerReconcile(store, persister=None, page=2)
    first = reconcile.run(0, 300, Budget(100, 2.5, clock))
    assert (first.accounts, first.next_after) == (6, 6)  # three pages of two, then the 2.5 s were spent
    second = reconcile.run(0, 300, Budget(100, 2.5, clock), after=first.next_after)
    assert (second.accounts, second.next_after) == (4, 0)  # the rest, and the pass is complete
    assert sum(store.pages, []) == list(range(1, 11))


class Part:
    def __init__(self, report, fail=False):
        self.report, self.fail, self.calls = report, fail, []

    def run(self, now_ms, age_s, budget, after):
        self.calls.append(after)
        if self.fail:
            raise RuntimeError("broken")
        self.report.next_after = after + 10
        return self.report


class Notices:
    def __init__(self):
        self.calls = []

    def scan(self, now_ms):
        self.calls.append("journeys")
        return JourneyScanReport()

    def reoffer_lost_reminders_within(self, now_ms, budget, after):
        self.calls.append("reminders")
        raise ConnectionError("the DB is down")

    def close_overdue(self, now_ms):
        self.calls.append("orders")
        return 2


class NoHolds:
    def overdue(self, before_ms, after_id, limit):
        return []

    def expire(self, user_id, entity_id):
        raise AssertionError("nothing is overdue")

    def post_alerts(self, budget):
        return 0


class NoTransfers:
    def run(self, now_ms, age_s):
        from hotledger.transfers.reconcile import TransferReconcileReport

        return TransferReconcileReport()


class Cursors(dict):
    def get(self, part):
        return super().get(part, 0)

    def set(self, part, after):
        self[part] = after


def test_a_part_that_raises_is_reported_and_the_others_run_and_keep_their_cursors(monkeypatch):
    """The parts as the registered features declare them (hotledger.features), over fake services."""
    import importlib

    from hotledger.dal import retention
    from hotledger.features import registered

    notices, cursors = Notices(), Cursors(accounts=5)
    accounts = Part(AccountsReconcileReport(accounts=3))
    vouchers = Part(VoucherReconcileReport(), fail=True)
    packets = Part(PacketReconcileReport())
    webhooks = SimpleNamespace(store=SimpleNamespace(prune=lambda older_than_ms, budget: 2))  # its retention part
    for feature, name, fake in (  # each feature's services, as its feature.py builds them
        ("ledger", "ledger_reconcile", accounts),
        ("vouchers", "voucher_reconciler", vouchers),
        ("redpackets", "packet_reconciler", packets),
        ("notices", "payment_orders", notices),
        ("notices", "journeys", notices),
        ("holds", "holds", NoHolds()),
        ("grants", "grants", NoHolds()),
        ("monitors", "monitors", NoHolds()),
        ("transfers", "transfer_reconciler", NoTransfers()),
        ("webhooks", "webhooks", webhooks),
    ):
        monkeypatch.setattr(importlib.import_module(f"hotledger.{feature}.feature"), name, lambda fake=fake: fake)
    monkeypatch.setattr(retention, "prune", lambda older_than_ms, budget: {"keys": 4})
    reconciler = Reconciler([part for feature in registered() for part in feature.reconcile_parts()], 60, cursors)
    report = reconciler.run(0)
    assert report.failed_parts == ["vouchers", "reminders"]
    assert notices.calls == ["journeys", "reminders", "orders"] and report.orders_closed == 2
    assert (report.accounts, report.next_after, accounts.calls) == (3, 15, [5])
    assert cursors == {
        "accounts": 15,
        "holds": 0,
        "grants": 0,
        "packets": 10,
    }  # a failed part keeps its cursor: the next run repeats it
    assert set(report.part_seconds) == {
        "accounts",
        "holds",
        "grants",
        "vouchers",
        "packets",
        "transfers",
        "journeys",
        "reminders",
        "orders",
        "alerts",
        "keys",
        "webhooks",
    }
    assert report.keys_pruned == 4 and report.webhooks_pruned == 2
