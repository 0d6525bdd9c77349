"""Unfinished-business reminders (the seed's password-recovery case): a start is recorded once per
(biz, account) with its start time (a repeated start keeps the first), a finish removes it, and a scheduled
scan turns starts older than the biz's threshold into one inbox message each (outer_biz_id = account:start, so
a rescan or a crash between the message and the removal writes nothing twice; a journey started again
meanwhile is kept for its own reminder)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from hotledger import errors
from hotledger.notices.inbox import Inbox
from hotledger.notices.store import JourneyStore

TEXTS = {
    "password-recovery": (
        "Recover your password with your face",
        "You did not finish recovering your password. Face recognition in the app does it in a minute.",
        "app://security/face-recovery",
    ),
}
DEFAULT_TEXT = ("Pick up where you left off", "You started something in the app and did not finish it.", None)


def parse_thresholds(spec: str) -> dict[str, int]:
    """'password-recovery=1800,bind-card=600' -> {biz: seconds}."""
    return {biz.strip(): int(seconds) for biz, seconds in (part.split("=") for part in spec.split(",") if part.strip())}


@dataclass
class JourneyScanReport:
    reminded: int = 0


class Journeys:
    def __init__(self, store: JourneyStore, inbox: Inbox, thresholds: dict[str, int], page: int = 500):
        self.store, self.inbox, self.thresholds, self.page = store, inbox, thresholds, page

    def _known(self, biz: str) -> None:
        if biz not in self.thresholds:
            raise errors.JourneyNotFound(f"no journey {biz!r}; known: {', '.join(sorted(self.thresholds))}")

    def start(self, biz: str, account: int, now_ms: int) -> int:
        """Returns the start time in force: a repeated start keeps the first one."""
        self._known(biz)
        if not self.inbox.account_exists(account):
            raise errors.AccountNotFound(f"account {account} does not exist")
        return self.store.start(biz, account, now_ms)

    def finish(self, biz: str, account: int) -> bool:
        self._known(biz)
        return self.store.finish(biz, account)

    def scan(self, now_ms: int) -> JourneyScanReport:
        """One page per biz of the starts older than its threshold: one inbox message each, then dropped."""
        report = JourneyScanReport()
        for biz, after_s in self.thresholds.items():
            title, content, url = TEXTS.get(biz, DEFAULT_TEXT)
            for account, started in self.store.started_before(biz, now_ms - after_s * 1000, self.page):
                with contextlib.suppress(errors.AccountNotFound):  # the account is gone: nobody to remind
                    self.inbox.post(account, f"JOURNEY_{biz}", f"{account}:{started}", title, content, url)
                self.store.done(biz, account, started)
                report.reminded += 1
        return report
