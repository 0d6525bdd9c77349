"""The scheduled reconciler run as its function runs: once, or until every part went over all of its entities."""

from __future__ import annotations

from infra.localrt import events


def reconcile(monkeypatch=None, age_s: int | None = None) -> dict:
    """One scheduled run of the reconciler function; with age_s, entries older than that count as stale."""
    from reconciler.app import handler

    from hotledger.runtime import reconciler

    if age_s is not None:
        monkeypatch.setattr(reconciler(), "age_s", age_s)
    return handler(events.scheduled(), events.LambdaContext("ReconcilerFunction"))


def reconcile_pass(monkeypatch=None, age_s: int | None = None) -> list[dict]:
    """Reconciler runs until each part (accounts, vouchers, packets) went over all of its entities from the first,
    since this call: a run stops where its budget (items or seconds) ran out and the next goes on from there, and the
    suite leaves many entities behind, so one run may not reach a test's own. A part first finishes the pass an
    earlier run left open, then makes one whole pass. Returns the reports of the runs."""
    parts = {
        "accounts": lambda r: r["next_after"],
        "vouchers": lambda r: r["vouchers"]["next_after"],
        "packets": lambda r: r["packets"]["next_after"],
        "reminders": lambda r: r["reminders_next_after"],
    }
    ends_seen = dict.fromkeys(parts, 0)  # 2: the open pass finished, then a whole one
    reports = []
    while min(ends_seen.values()) < 2:
        reports.append(reconcile(monkeypatch, age_s))
        for part, next_after in parts.items():
            ends_seen[part] += not next_after(reports[-1])
    return reports


def reconcile_totals(monkeypatch=None, age_s: int | None = None) -> dict:
    """reconcile_pass, its reports summed (each count over the whole pass, whatever each run's budget covered)."""

    def add(totals: dict, report: dict) -> dict:
        for name, value in report.items():
            if isinstance(value, dict):  # a part's own report (vouchers, packets, journeys)
                add(totals.setdefault(name, {}), value)
            elif isinstance(value, float):  # an age: the oldest seen
                totals[name] = max(totals.get(name, value), value)
            elif isinstance(value, int) and not isinstance(value, bool) and not name.endswith("next_after"):
                totals[name] = totals.get(name, 0) + value
        return totals

    totals: dict = {}
    for report in reconcile_pass(monkeypatch, age_s):
        add(totals, report)
    return totals
