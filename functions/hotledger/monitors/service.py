"""Balance monitors: `below` (a low-balance alert, re-armed once the balance is back at or above `rearm_above`) and
`above` (re-armed at or below `rearm_below`).

Judged where every balance change of every feature is booked (the ledger's transaction, under the account row lock,
entry by entry in seq order: monitors.store.judge), not in the charge script: a crossing is then a durable fact that
fires exactly once, however the changes interleave, whatever Redis lost or a rollback took back, and the hot path pays
nothing for it. 100,000 oscillations around the line give exactly the crossings (the hysteresis: a disarmed monitor
waits for the re-arm line), not one alert per charge, which is what Blnk's and Lago's users met. Each crossing is a
webhook event (balance.below / balance.above, with the seq of the entry that crossed) and one inbox message to the
user (outer id monitor:seq, so posting it twice is one message), posted by the reconciler's `alerts` part."""

from __future__ import annotations

import time
from collections.abc import Callable

from hotledger import errors
from hotledger.dal.budget import Budget
from hotledger.money import format_minor
from hotledger.monitors.store import ABOVE, BELOW, MonitorStore
from hotledger.monitors.store import Monitor as Monitor  # re-exported: the routes name it, never the store
from hotledger.notices.inbox import Inbox

MAX_MONITORS = 20  # per account


class Monitors:
    def __init__(
        self,
        store: MonitorStore,
        inbox: Inbox,
        account_exists: Callable[[int], bool],
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        formatter: Callable[[int], Callable[[int], str]] = lambda user_id: format_minor,
    ) -> None:
        """formatter(user_id): how the account's amounts are written (its currency's digits)."""
        self.store, self.inbox, self.account_exists, self.clock = store, inbox, account_exists, clock
        self.formatter = formatter

    def create(self, user_id: int, direction: str, threshold: int, rearm: int | None) -> Monitor:
        if not self.account_exists(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        rearm = threshold if rearm is None else rearm
        if (direction == BELOW and rearm < threshold) or (direction == ABOVE and rearm > threshold):
            raise errors.InvalidMonitor(
                "the re-arm line is on the other side of the line from the alert (below: "
                "rearm_above >= below; above: rearm_below <= above)"
            )
        if len(self.store.monitors(user_id)) >= MAX_MONITORS:
            raise errors.InvalidMonitor(f"an account has at most {MAX_MONITORS} monitors")
        return self.store.create(user_id, direction, threshold, rearm, self.clock())

    def list(self, user_id: int) -> list[Monitor]:
        return self.store.monitors(user_id)

    def delete(self, user_id: int, monitor_id: int) -> None:
        if not self.store.delete(user_id, monitor_id):
            raise errors.MonitorNotFound(f"monitor {monitor_id} of account {user_id} does not exist")

    def post_alerts(self, budget: Budget) -> int:
        """The crossings not in the inbox yet, each one message (idempotent by monitor:seq); returns how many."""
        posted = 0
        while not budget.exhausted:
            alerts = self.store.unposted(budget.page(100))
            if not alerts:
                break
            for a in alerts:
                word = "below" if a.direction == BELOW else "above"
                format_minor = self.formatter(a.user_id)
                self.inbox.post(
                    a.user_id,
                    f"balance.{a.direction}",
                    f"{a.monitor_id}:{a.seq}",
                    f"Balance {word} {format_minor(a.threshold)}",
                    f"Your balance is {format_minor(a.balance)}.",
                )
                self.store.posted(a)
                posted += 1
            budget.spend(len(alerts))
        return posted
