"""Bounded work per run (issue 10, item 14): each part of the reconciler works in pages within its own budget,
continues the next run where it stopped, and a part that raises does not stop the others."""

import pytest

from helpers import reconcile as run_reconciler
from hotledger.ledger.feature import ledger_reconcile
from hotledger.notices import feature as notices_feature
from hotledger.runtime import reconciler
from hotledger.vouchers.feature import voucher_reconciler


@pytest.fixture
def reconcile(monkeypatch):
    return lambda: run_reconciler(monkeypatch, 3600)


def test_a_run_stops_within_its_budget_and_the_next_continues_where_it_stopped(api, sql, monkeypatch, reconcile):
    for _ in range(5):
        api.account()
    total = sql("SELECT COUNT(*) FROM t_user")[0][0]
    monkeypatch.setattr(ledger_reconcile(), "page", 2)
    monkeypatch.setattr(reconciler(), "part_items", 3)
    while reconcile()["next_after"]:  # finish the pass an earlier test may have left open
        pass
    seen, runs = 0, 0
    while True:
        report = reconcile()
        runs += 1
        assert report["accounts"] <= 3
        seen += report["accounts"]
        if not report["next_after"]:
            break
    # every account once per pass, in runs of at most 3; a run that fills its budget exactly cannot know it reached
    # the end, so when total % 3 == 0 one last run finds nothing: total // 3 + 1 runs whatever the total
    assert seen == total and runs == total // 3 + 1


def test_a_part_that_raises_does_not_stop_the_others(api, sql, monkeypatch, reconcile):
    def broken(*args, **kwargs):
        raise RuntimeError("the vouchers part broke")

    monkeypatch.setattr(voucher_reconciler(), "run", broken)
    ran = []
    for name in ("scan", "close_overdue"):
        part = notices_feature.journeys() if name == "scan" else notices_feature.payment_orders()
        real = getattr(part, name)
        monkeypatch.setattr(part, name, lambda *a, real=real, name=name, **k: (ran.append(name), real(*a, **k))[1])
    monkeypatch.setattr(ledger_reconcile(), "run", broken)
    report = reconcile()
    assert report["failed_parts"] == ["accounts", "vouchers"]
    assert ran == ["scan", "close_overdue"]
    assert set(report["part_seconds"]) == {
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
