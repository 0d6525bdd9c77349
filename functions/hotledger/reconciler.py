"""Reconciler, run on a schedule.

The parts are the registered features' (hotledger.features), in the registry's order: accounts (ledger/reconcile.py:
stale pending entries persisted, ASYNC caches behind the DB corrected; the report counts the pending entries
and their oldest age), vouchers and red packets (vouchers/reconcile.py, redpackets/reconcile.py), unfinished
journeys become inbox reminders and order-close reminders Redis lost are offered again, orders past their close
time closed (notices/), key and rollback records past their retention pruned (dal/retention.py).

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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hotledger.dal.budget import Budget
from hotledger.ledger.reconcile import AccountsReconcileReport
from hotledger.notices.journeys import JourneyScanReport
from hotledger.redpackets.reconcile import PacketReconcileReport
from hotledger.transfers.reconcile import TransferReconcileReport
from hotledger.vouchers.reconcile import VoucherReconcileReport

if TYPE_CHECKING:
    from hotledger.dal.cursor import Cursors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartContext:
    """What one reconciler run gives each part."""

    now_ms: int
    age_s: int  # entries charged longer ago than this count as stale (RECONCILE_AGE_S)
    budget: Budget  # the part's own: it stops at a page boundary when this runs out
    cursor: int  # where this part stopped last run (0: at the start)
    report: ReconcileReport  # the part fills its own fields


PartRun = Callable[[PartContext], "int | None"]  # returns the cursor to keep for the next run, or None to keep none


@dataclass(frozen=True, kw_only=True)
class ReconcilePart:
    """One part of the reconciler, declared by its feature (hotledger.features: Feature.reconcile_parts)."""

    name: str
    run: PartRun


def expiry_part(
    name: str,
    overdue: Callable[[int, int, int], list[tuple[int, int]]],
    end: Callable[[int, int], bool],
    grace_ms: Callable[[], int],
    counted: str,
) -> ReconcilePart:
    """A part ending what expired (a hold, a grant) more than grace_ms ago and is still open in the DB: its delay
    element was lost (grace_ms() read at each run). overdue(before_ms, after_id, limit) -> [(user_id, id)] by id; end(user_id, id) -> ended now;
    `counted` names the report's field of how many ended."""

    def run(ctx: PartContext) -> int:
        after, ended = ctx.cursor, 0
        while not ctx.budget.exhausted:
            due = overdue(ctx.now_ms - grace_ms(), after, ctx.budget.page(100))
            if not due:
                return 0
            for user_id, entity_id in due:
                ended += end(user_id, entity_id)
            ctx.budget.spend(len(due))
            after = due[-1][1]
            setattr(ctx.report, counted, ended)
        return after

    return ReconcilePart(name=name, run=run)


@dataclass
class ReconcileReport(AccountsReconcileReport):
    vouchers: VoucherReconcileReport = field(default_factory=VoucherReconcileReport)
    packets: PacketReconcileReport = field(default_factory=PacketReconcileReport)
    transfers: TransferReconcileReport = field(default_factory=TransferReconcileReport)
    journeys: JourneyScanReport = field(default_factory=JourneyScanReport)
    reminders_reoffered: int = 0
    orders_closed: int = 0
    alerts_posted: int = 0  # balance monitors' crossings posted to the inbox this run
    holds_expired: int = 0  # holds past expires_at (and a grace) the DB still had ACTIVE, ended this run
    grants_expired: int = 0  # grants past expires_at (and a grace) the DB still had ACTIVE, ended this run
    keys_pruned: int = 0  # key and rollback records past KEY_RETENTION_DAYS deleted this run
    webhooks_pruned: int = 0  # deliveries and alerts past WEBHOOK_RETENTION_DAYS, deleted endpoints' rows, this run
    reminders_next_after: int = (
        0  # the payment order the next run's reminders part continues after; 0: it reached the last
    )
    failed_parts: list[str] = field(default_factory=list)  # parts that raised this run (logged with the error)
    part_seconds: dict[str, float] = field(default_factory=dict)  # how long each part took


class Reconciler:
    def __init__(
        self,
        parts: Sequence[ReconcilePart],
        age_s: int,
        cursors: Cursors | None = None,
        part_items: int = 2**62,
        part_s: float = 10.0**9,
        clock: Callable[[], float] = time.monotonic,
    ):
        """parts: every registered feature's (hotledger.features), run in their order each run."""
        self.parts, self.age_s, self.cursors = tuple(parts), age_s, cursors
        self.part_items, self.part_s, self.clock = part_items, part_s, clock

    def run(self, now_ms: int) -> ReconcileReport:
        report = ReconcileReport()
        for part in self.parts:
            self._part(part, now_ms, report)
        return report

    def _part(self, part: ReconcilePart, now_ms: int, report: ReconcileReport) -> None:
        started, before = self.clock(), _flat(asdict(report))
        try:
            after = part.run(
                PartContext(
                    now_ms,
                    self.age_s,
                    Budget(self.part_items, self.part_s, self.clock),
                    self._cursor(part.name),
                    report,
                )
            )
            if after is not None:
                self._save(part.name, after)
        except Exception:  # this part alone failed this run: the others go on, the next run tries it again
            log.exception("reconciler part failed; the other parts go on", extra={"part": part.name})
            report.failed_parts.append(part.name)
        report.part_seconds[part.name] = round(self.clock() - started, 3)
        self._record(part.name, now_ms, report, before)

    def _record(self, part: str, now_ms: int, report: ReconcileReport, before: dict[str, Any]) -> None:
        """The part's last run for operators: what it changed in the report is what it found."""
        if self.cursors is None:
            return
        found = {
            name: value
            for name, value in _flat(asdict(report)).items()
            if value != before.get(name) and name not in ("failed_parts", f"part_seconds.{part}")
        }
        try:
            self.cursors.record_run(
                part,
                {
                    "at_ms": now_ms,
                    "seconds": report.part_seconds[part],
                    "failed": part in report.failed_parts,
                    "findings": found,
                },
            )
        except Exception:  # a record for operators only: its loss never fails the run
            log.warning("reconciler part's run not recorded", extra={"part": part}, exc_info=True)

    def _cursor(self, part: str) -> int:
        return self.cursors.get(part) if self.cursors is not None else 0

    def _save(self, part: str, after: int) -> None:
        if self.cursors is not None:
            self.cursors.set(part, after)


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A report's fields as name -> value, nested reports' fields as 'vouchers.rebuilt' and so on."""
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat
