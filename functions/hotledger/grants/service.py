"""Credit grants (issue 34): a recharge may carry a grant (ledger.service.Ledger.recharge); deducts spend the live
grants first-to-expire, then the plain balance (layers/lua/lib/grants.lua for an ASYNC account, grants.rows for a
SYNC one). This service ends grants at their expires_at.

Invariants:
- an expired grant never counts in `available` nor is spent, read at any moment: the scripts and the SYNC path judge
  expiry by their own clock, whether or not the expiry entry is booked yet (like a hold's expiry);
- a grant ends once: its expiry entry (kind G) takes what is left of it off the balance, made durable like a deduct
  and booked by the writer; the DB keeps one expiry per grant (t_grant_expiry's unique grant_id), so an expiry made
  twice across a Redis loss is refused by the books, never booked twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from hotledger import errors
from hotledger.dal.delay_queue import DelayQueue
from hotledger.grants.replies import ExpireReply, ExpireStatus
from hotledger.grants.store import GrantStore
from hotledger.grants.tx import insert_grant_changes
from hotledger.ledger.entry import Entry
from hotledger.ledger.kinds import KIND_DEDUCT, KIND_GRANT_EXPIRY
from hotledger.ledger.rows import AccountRow
from hotledger.ledger.service import Ledger, after_change
from hotledger.ledger.tx import LedgerTx
from hotledger.outbox.durable import Durability, Outbound
from hotledger.outbox.events import LedgerEvent

GRANT_EXPIRY = "grant-expiry"  # delay queue of 'user_id:grant_id' elements, due at the grant's expires_at
EXPIRY_RETRY_MS = 1_000


class _NotNow(Exception):
    """The SYNC grant is not due yet (or has nothing left): nothing is booked."""

    def __init__(self, done: bool):
        super().__init__("grant not due" if not done else "grant ended")
        self.done = done


class _Expiry:
    """An ASYNC grant's expiry as a change Durability.apply makes durable."""

    what = "grant expiry"

    def __init__(self, grants: Grants, user_id: int, grant_id: int):
        self.grants, self.user_id, self.grant_id = grants, user_id, grant_id

    def attempt(self, entry_id: int) -> ExpireReply:
        reply = self.grants.store.expire(self.user_id, self.grant_id, entry_id, self.grants.clock())
        if reply.status is ExpireStatus.HELD and self.grants.ledger.lift_rebuild_hold(self.user_id, reply.retry_at):
            # the writer applied what was on its way: the account is the DB's again, with every spend of the grant
            return self.grants.store.expire(self.user_id, self.grant_id, entry_id, self.grants.clock())
        return reply

    def reload(self) -> None:
        self.grants.ledger.load_cache(self.user_id)

    def refusal(self, reply: ExpireReply) -> errors.DomainError | None:
        return None

    def outbound(self, entry_id: int, reply: ExpireReply) -> Outbound | None:
        if reply.status is not ExpireStatus.OK:
            return None
        user_id = self.user_id
        entry = Entry(
            entry_id,
            user_id,
            reply.amount,
            self.grants.clock(),
            reply.balance,
            reply.version,
            KIND_GRANT_EXPIRY,
            reply.epoch,
            reply.open_flag,
            grant=str(self.grant_id),
        )
        return Outbound(
            str(user_id), entry.event, lambda: self.grants.ledger.take_back(user_id, entry_id, KIND_GRANT_EXPIRY)
        )

    def unknown(self, entry_id: int, why: str) -> errors.DomainError:
        return errors.ChargeOutcomeUnknown(f"{why}: grant expiry {entry_id} may or may not be made")


class Grants:
    def __init__(
        self,
        store: GrantStore,
        durability: Durability,
        ledger: Ledger,
        queue: DelayQueue,
        next_id: Callable[[], int],
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.store, self.durability, self.ledger, self.queue = store, durability, ledger, queue
        self.next_id, self.clock = next_id, clock

    def schedule_expiry(self, user_id: int, grant_id: int, expires_at: int) -> None:
        """The grant's expiry, due at its expires_at (the drainer books it; until then the scripts count it for
        nothing past expires_at all the same)."""
        with contextlib.suppress(Exception):
            self.queue.offer(GRANT_EXPIRY, f"{user_id}:{grant_id}", due_at_ms=expires_at)

    def expire_due(self, elements: list[str]) -> None:
        """Delay-queue handler: each grant past its expires_at ends (offered again a second later when not yet)."""
        for element in elements:
            user_id, _, grant_id = element.partition(":")
            if not self.expire(int(user_id), int(grant_id)):
                self.queue.offer(GRANT_EXPIRY, element, delay_ms=EXPIRY_RETRY_MS)

    def expire(self, user_id: int, grant_id: int) -> bool:
        """True when the grant has ended (now or before) or is unknown; False to try again later."""
        for _ in range(2):
            _, reply = self.durability.apply(_Expiry(self, user_id, grant_id))
            if reply.status is not ExpireStatus.SYNC:
                return reply.status not in (ExpireStatus.EARLY, ExpireStatus.RECOVERING, ExpireStatus.HELD)
            entry_id = self.next_id()
            try:
                if self.ledger.change_in_db(user_id, entry_id, self._decide(grant_id, entry_id), insert_grant_changes):
                    return True
            except _NotNow as not_now:
                return not_now.done
        return False

    def overdue(self, before_ms: int, after_id: int, limit: int) -> list[tuple[int, int]]:
        """(user_id, grant_id) of grants the DB still has ACTIVE with something left though they expired before
        before_ms, after after_id."""
        return self.store.due_in_db(before_ms, after_id, limit)

    def _decide(self, grant_id: int, entry_id: int) -> Callable[[LedgerTx, AccountRow, int], LedgerEvent]:
        """The SYNC expiry of the grant, on the DB's account (the scripts' rules: lib/grants.lua)."""

        def decide(tx: LedgerTx, account: AccountRow, now_ms: int) -> LedgerEvent:
            grant = next((g for g in tx.active_grants(account.user_id) if g.grant_id == grant_id), None)
            if grant is None:
                raise _NotNow(done=True)
            if grant.live(now_ms):
                raise _NotNow(done=False)
            balance = account.balance - grant.remaining
            return LedgerEvent(
                type="ledger",
                id=entry_id,
                kind=KIND_GRANT_EXPIRY,
                user_id=account.user_id,
                amount=grant.remaining,
                balance_after=balance,
                version=account.version + 1,
                epoch="",
                ts=now_ms,
                open=after_change(KIND_DEDUCT, balance, account.open_flag),
                grant_id=grant_id,
            )

        return decide
