"""Holds: authorize now, capture later (in parts, or the rest), void, or let it lapse.

A hold keeps its amount out of the account's `available` (balance - held credits - active holds) at once; the balance
moves only when a capture takes from it. Each change is one ledger entry (kinds H, C, V, X) made by one script on the
account's slot, made durable like a deduct (outbox.durable: published, or taken back with the DB as arbiter) and booked
by the writer with the account's next seq.

Invariants (the defects other ledgers' users met, made impossible here):
- a hold moves ACTIVE -> CAPTURED | VOIDED | EXPIRED exactly once: every change is a compare-and-set on the hold's
  state in the account's script; a capture or void after the end is refused with the code of how it ended
  (HOLD_CAPTURED, HOLD_VOIDED, HOLD_EXPIRED), a capture over what is left with CAPTURE_EXCEEDS_HOLD;
- an authorize is refused like a deduct (INSUFFICIENT_BALANCE against `available`, API_CLOSED), so a refused hold is
  never captured and no capture overdraws: captures take only what the hold kept;
- an expired hold never counts in `available`, read at any moment: the scripts leave out holds past expires_at
  whether or not the delay queue has tidied them yet (the expiry entry follows from the drainer, or the reconciler);
- a hold ends only when every capture before it is durable (the script answers `busy` meanwhile), so a capture taken
  back after a failed publish can never contradict how the hold ended;
- with an Idempotency-Key each request acts once (api.idempotency `once`, durable): its retry answers the first
  answer, and a retry of a request that died resumes from the hold or change id it left.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from hotledger import errors
from hotledger.dal.delay_queue import DelayQueue
from hotledger.grants.rows import encode_spent, expired_remaining, spend
from hotledger.holds.replies import HoldReply, HoldStatus
from hotledger.holds.rows import ACTIVE, Hold
from hotledger.holds.store import CAPTURE, EXPIRE, VOID, HoldStore
from hotledger.holds.tx import insert_changes, insert_changes_and_spends, lock_hold
from hotledger.ledger.entry import Entry, HoldChange
from hotledger.ledger.rows import AccountRow
from hotledger.ledger.service import Ledger, after_change
from hotledger.ledger.tx import LedgerTx
from hotledger.money import MAX_MINOR
from hotledger.outbox.durable import Durability, Outbound, Step
from hotledger.outbox.events import LedgerEvent

HOLD_EXPIRY = "hold-expiry"  # delay queue of 'user_id:hold_id' elements, due at the hold's expires_at
EXPIRY_RETRY_MS = 1_000
MAX_EXPIRES_IN_S = 30 * 86_400
ENDED = {"CAPTURED": errors.HoldCaptured, "VOIDED": errors.HoldVoided, "EXPIRED": errors.HoldExpired}

# what a request leaves before any effect: the id of the hold or change it is about to make (api.idempotency's
# Attempt.remember), so a retry of a request that died resumes from it
Remember = Callable[[str], object]


@dataclass(frozen=True)
class HoldView:
    hold: Hold
    balance: int | None = None  # the account after the request (None: read from the DB, no change made now)
    available: int | None = None
    entry_id: int | None = None  # the ledger entry the request made (None on reads and resumed requests)


class Holds:
    def __init__(
        self,
        store: HoldStore,
        durability: Durability,
        ledger: Ledger,
        queue: DelayQueue,
        next_id: Callable[[], int],
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """ledger: the accounts' service (load_cache, take_back of an entry, post of a durable entry); queue: the
        delay queue that tidies expired holds."""
        self.store, self.durability, self.ledger, self.queue = store, durability, ledger, queue
        self.next_id, self.clock = next_id, clock

    # authorize ------------------------------------------------------------------------------------------------------
    def authorize(
        self,
        user_id: int,
        amount: int,
        expires_in_s: int,
        description: str,
        remember: Remember | None = None,
        resumed_from: str | None = None,
    ) -> HoldView:
        if not 0 < amount <= MAX_MINOR:
            raise errors.DomainError("amount out of range")
        if resumed_from is not None:  # the request died after it left this id: the hold may stand
            found = self._find(user_id, int(resumed_from))
            if found is not None:
                return HoldView(found)
        now = self.clock()
        expires_at = now + expires_in_s * 1000
        made: dict[int, Hold] = {}

        def attempt(hold_id: int) -> HoldReply:
            if remember is not None:
                remember(str(hold_id))
            made[hold_id] = Hold(hold_id, user_id, amount, 0, ACTIVE, expires_at, now, description)
            return self.store.authorize(user_id, hold_id, amount, now, expires_at, description)

        def outbound(hold_id: int, reply: HoldReply) -> Outbound:
            entry = Entry(
                hold_id,
                user_id,
                amount,
                now,
                reply.balance,
                reply.version,
                "H",
                reply.epoch,
                reply.open_flag,
                None,
                HoldChange(hold_id, 0, expires_at, reply.available, ACTIVE, description, 0),
            )
            return self._outbound(entry, waits=True)

        def in_db(tx: LedgerTx, account: AccountRow, now_ms: int) -> LedgerEvent:
            # an expired grant is out of reach for a hold too (grants.rows: the scripts' rule)
            available = (
                account.balance
                - tx.live_on_hold(account, now_ms)
                - expired_remaining(tx.active_grants(user_id), now_ms)
            )
            if account.open_flag != "1":
                raise errors.ApiClosed("the account's API is closed")
            if available - amount < account.threshold:
                raise errors.InsufficientBalance("available - amount would fall below the account's threshold")
            made[hold_id] = Hold(hold_id, user_id, amount, 0, ACTIVE, expires_at, now, description)
            return LedgerEvent(
                type="ledger",
                id=hold_id,
                kind="H",
                user_id=user_id,
                amount=amount,
                balance_after=account.balance,
                version=account.version + 1,
                epoch="",
                ts=now,
                open=account.open_flag,
                hold_id=hold_id,
                expires_at=expires_at,
                available_after=available - amount,
                hold_state=ACTIVE,
                description=description,
            )

        while True:
            hold_id, reply = self._apply(user_id, attempt, outbound, "hold")
            if reply.status is HoldStatus.SYNC:
                change = self.ledger.change_in_db(user_id, hold_id, in_db, insert_changes)
                if change is None:
                    continue  # ASYNC after all: the stale cache was dropped
                reply = HoldReply.booked(change)
            self._schedule_expiry(user_id, hold_id, expires_at)
            return HoldView(made[hold_id], reply.balance, reply.available, hold_id)

    # capture, void, expire ----------------------------------------------------------------------------------------
    def capture(
        self,
        user_id: int,
        hold_id: int,
        amount: int | None,
        final: bool,
        remember: Remember | None = None,
        resumed_from: str | None = None,
    ) -> HoldView:
        return self._change(CAPTURE, user_id, hold_id, amount or 0, final, remember, resumed_from)

    def void(
        self, user_id: int, hold_id: int, remember: Remember | None = None, resumed_from: str | None = None
    ) -> HoldView:
        return self._change(VOID, user_id, hold_id, 0, False, remember, resumed_from)

    def expire_due(self, elements: list[str]) -> None:
        """Delay-queue handler: each hold past its expires_at gives back what it kept, once no capture of it is in
        flight (offered again a second later otherwise)."""
        for element in elements:
            user_id, _, hold_id = element.partition(":")
            if not self.expire(int(user_id), int(hold_id)):
                self.queue.offer(HOLD_EXPIRY, element, delay_ms=EXPIRY_RETRY_MS)

    def expire(self, user_id: int, hold_id: int, adopt: bool = False) -> bool:
        """True when the hold has ended (now or before) or is unknown; False to try again later (a capture of it is in
        flight, it is not due yet, or its account was rebuilt after a Redis loss and its own records are still on their
        way to the DB). adopt (the reconciler, past expires_at and a grace): a hold the DB has ACTIVE
        that Redis lost is put back first, so its expiry is booked like any other."""
        try:
            self._change(EXPIRE, user_id, hold_id, 0, False, None, None)
        except (errors.HoldBusy, errors.HoldNotDue, errors.Recovering):
            return False  # a capture in flight, not due, or its account's records still on their way to the DB
        except errors.HoldNotFound:
            stored = self.store.stored(user_id, hold_id)
            if adopt and stored is not None and stored.state == ACTIVE:
                self.ledger.load_cache(user_id)  # no-op when cached
                if self.store.adopt(stored) == "adopted":
                    return self.expire(user_id, hold_id)
            return True
        except (errors.HoldCaptured, errors.HoldVoided, errors.HoldExpired):
            return True
        return True

    def overdue(self, before_ms: int, after_id: int, limit: int) -> list[tuple[int, int]]:
        """(user_id, hold_id) of holds the DB still has ACTIVE though they expired before before_ms, after after_id."""
        return self.store.due_in_db(before_ms, after_id, limit)

    def _change(
        self,
        op: str,
        user_id: int,
        hold_id: int,
        amount: int,
        final: bool,
        remember: Remember | None,
        resumed_from: str | None,
    ) -> HoldView:
        if resumed_from is not None:
            found = self._changed(user_id, int(resumed_from))
            if found is not None:
                return HoldView(found)
        now = self.clock()

        def attempt(entry_id: int) -> HoldReply:
            if remember is not None:
                remember(str(entry_id))
            reply = self.store.change(op, user_id, hold_id, entry_id, now, amount, final)
            if reply.status is HoldStatus.HELD and self.ledger.lift_rebuild_hold(user_id, reply.retry_at):
                # the writer applied what was on its way: the account is the DB's again, with this hold as booked
                return self.store.change(op, user_id, hold_id, entry_id, now, amount, final)
            return reply

        def outbound(entry_id: int, reply: HoldReply) -> Outbound:
            entry = Entry(
                entry_id,
                user_id,
                reply.amount,
                now,
                reply.balance,
                reply.version,
                op,
                reply.epoch,
                reply.open_flag,
                None,
                HoldChange(
                    hold_id, reply.released, reply.expires_at, reply.available, reply.state, None, reply.captured
                ),
                grant=reply.grants_spent or None,
            )
            return self._outbound(entry, waits=op == CAPTURE and reply.state == ACTIVE)

        def in_db(tx: LedgerTx, account: AccountRow, now_ms: int) -> LedgerEvent:
            hold = lock_hold(tx.cursor, user_id, hold_id)
            if hold is None:
                raise errors.HoldNotFound(f"hold {hold_id} of account {user_id} does not exist")
            take, released, state = transition(op, hold, amount, final, now_ms)
            live = tx.live_on_hold(account, now_ms)
            grants = tx.active_grants(user_id)
            expired = expired_remaining(grants, now_ms)  # never counted, in available_after either
            # hold_change.lua's rule: grants the hold was placed against that expired meanwhile are not there to
            # capture (the hold's own remaining counted free, no lower than a deduct could take the account)
            others = live - (hold.amount - hold.captured)
            if take and expired and account.balance - expired - others - take < account.threshold:
                raise errors.InsufficientBalance("the capture would take what expired grants held")
            change_amount = take if op == CAPTURE else released
            return LedgerEvent(
                type="ledger",
                id=entry_id_of[0],
                kind=op,
                user_id=user_id,
                amount=change_amount,
                balance_after=account.balance - take,
                version=account.version + 1,
                epoch="",
                ts=now_ms,
                open=after_change("D", account.balance - take, account.open_flag) if take else account.open_flag,
                hold_id=hold_id,
                released=released,
                expires_at=hold.expires_at,
                available_after=account.balance - take - expired - (live - take - released),
                hold_state=state,
                captured_after=hold.captured + take,
                grants_spent=encode_spent(spend(grants, take, now_ms)),
            )

        entry_id_of: list[int] = [0]
        while True:
            entry_id, reply = self._apply(user_id, attempt, outbound, "hold change", hold_id)
            if reply.status is not HoldStatus.SYNC:
                break
            entry_id_of[0] = entry_id
            change = self.ledger.change_in_db(user_id, entry_id, in_db, insert_changes_and_spends)
            if change is not None:
                reply = HoldReply.booked(change)
                break
        hold = self.store.cached(user_id, hold_id) or self.store.stored(user_id, hold_id)
        if hold is None:
            # the change stands, but Redis lost the hold before the DB booked it: no answer to give (not a domain
            # error, which would free the Idempotency-Key: a retry resumes from the change once the hold is readable)
            raise LookupError(f"hold {hold_id} of account {user_id}, changed by entry {entry_id}, could not be read")
        # as this change left it: a later change by another request may have moved it since
        return HoldView(
            replace(hold, captured=reply.captured, state=reply.state), reply.balance, reply.available, entry_id
        )

    # reads ------------------------------------------------------------------------------------------------------
    def get(self, user_id: int, hold_id: int) -> Hold:
        found = self._find(user_id, hold_id)
        if found is None:
            raise errors.HoldNotFound(f"hold {hold_id} of account {user_id} does not exist")
        return found

    def booked(self, user_id: int, hold_id: int) -> Hold | None:
        """The hold as the books hold it (its state and captured total in the DB), None when they do not."""
        return self.store.stored(user_id, hold_id)

    def list(self, user_id: int, state: str | None, limit: int, after_id: int) -> list[Hold]:
        """Newest first: what Redis knows (it is ahead of the DB) over what the DB holds."""
        cached = {h.hold_id: h for h in self.store.cached_all(user_id)}
        stored = {h.hold_id: h for h in self.store.stored_page(user_id, state, after_id, limit, self.clock())}
        merged = {**stored, **{i: h for i, h in cached.items() if not after_id or i < after_id}}
        chosen = [h for h in merged.values() if state is None or self._state(h) == state]
        return [self._as_seen(h) for h in sorted(chosen, key=lambda h: h.hold_id, reverse=True)[:limit]]

    # helpers ----------------------------------------------------------------------------------------------------
    def _apply(
        self,
        user_id: int,
        attempt: Callable[[int], HoldReply],
        outbound: Callable[[int, HoldReply], Outbound],
        what: str,
        hold_id: int | None = None,
    ) -> tuple[int, HoldReply]:
        return self.durability.apply(
            Step(
                what=what,
                attempt=attempt,
                reload=lambda: self.ledger.load_cache(user_id),
                refusal=lambda r: self._refusal(user_id, hold_id, r),
                outbound=self._outbound_of(outbound),
                unknown=lambda i, why: errors.ChargeOutcomeUnknown(
                    f"{why}: the {what} {i} may or may not be made; look at GET /accounts/{user_id}/holds before "
                    "retrying (or retry with the same Idempotency-Key)",
                    entry_id=str(i),
                ),
            )
        )

    def _refusal(self, user_id: int, hold_id: int | None, reply: HoldReply) -> errors.DomainError | None:
        status = reply.status
        if status is HoldStatus.OK:
            return None
        if status is HoldStatus.SYNC:
            return None  # the DB decides (Ledger.change_in_db)
        if status is HoldStatus.INSUFFICIENT:
            return errors.InsufficientBalance("available - amount would fall below the account's threshold")
        if status is HoldStatus.CLOSED:
            return errors.ApiClosed("the account's API is closed")
        if status is HoldStatus.TOO_MANY_PENDING:
            return errors.TooManyPending("the account's changes are not reaching the DB; retry later")
        if status is HoldStatus.EXCEEDS:
            return errors.CaptureExceedsHold(f"only {reply.remaining} minor units are left on the hold")
        if status is HoldStatus.BUSY:
            return errors.HoldBusy("a capture of this hold is still being recorded; retry in a moment")
        if status in (HoldStatus.RECOVERING, HoldStatus.HELD):
            return errors.Recovering(
                "the account is being restored after a cache failure: its holds change once the changes acknowledged "
                "before the failure are in the DB; retry in a few seconds",
                retry_at=str(reply.retry_at),
            )
        if status is HoldStatus.NOT_DUE:
            return errors.HoldNotDue("the hold has not expired yet")
        if status is HoldStatus.EXPIRED:
            return errors.HoldExpired(f"hold {hold_id} expired")
        if status is HoldStatus.ENDED:
            return ENDED[reply.state](f"hold {hold_id} is {reply.state.lower()} already")
        # not in Redis: the DB may know how it ended (its record leaves Redis once that is booked)
        stored = self.store.stored(user_id, hold_id) if hold_id is not None else None
        if stored is not None and stored.state in ENDED:
            return ENDED[stored.state](f"hold {hold_id} is {stored.state.lower()} already")
        return errors.HoldNotFound(f"hold {hold_id} of account {user_id} does not exist")

    def _outbound_of(
        self, outbound: Callable[[int, HoldReply], Outbound]
    ) -> Callable[[int, HoldReply], Outbound | None]:
        return lambda change_id, reply: outbound(change_id, reply) if reply.status is HoldStatus.OK else None

    def _outbound(self, entry: Entry, waits: bool = False) -> Outbound:
        """waits: an authorize, whose hold may not change before it is durable (it may yet be taken back: a capture of
        it would take money against a hold that never was), or a partial capture, whose hold may not end before it
        is; ledger_post ends the wait once the broker acknowledged the event (ledger_settle or the take-back do, else)."""
        return Outbound(
            str(entry.user_id),
            entry.event,
            lambda: self.ledger.take_back(entry.user_id, entry.entry_id, entry.kind),
            made_durable=(lambda: self.ledger.post(entry.user_id, entry.entry_id)) if waits else None,
        )

    def _schedule_expiry(self, user_id: int, hold_id: int, expires_at: int) -> None:
        with contextlib.suppress(Exception):
            self.queue.offer(HOLD_EXPIRY, f"{user_id}:{hold_id}", due_at_ms=expires_at)

    def _find(self, user_id: int, hold_id: int) -> Hold | None:
        found = self.store.cached(user_id, hold_id) or self.store.stored(user_id, hold_id)
        return None if found is None else self._as_seen(found)

    def _changed(self, user_id: int, entry_id: int) -> Hold | None:
        """The hold a change made by an earlier attempt of this request acted on, if that change stands."""
        return self.store.hold_of_change(user_id, entry_id)

    def _state(self, hold: Hold) -> str:
        return "EXPIRED" if hold.state == ACTIVE and self.clock() >= hold.expires_at else hold.state

    def _as_seen(self, hold: Hold) -> Hold:
        """An ACTIVE hold past expires_at is EXPIRED to its readers at once, as it is to the scripts."""
        state = self._state(hold)
        return (
            hold
            if state == hold.state
            else Hold(
                hold.hold_id,
                hold.user_id,
                hold.amount,
                hold.captured,
                state,
                hold.expires_at,
                hold.created_at,
                hold.description,
            )
        )


def transition(op: str, hold: Hold, amount: int, final: bool, now_ms: int) -> tuple[int, int, str]:
    """hold_change.lua's rules for the SYNC path: (what is captured, what is released, the state after), or the
    refusal raised. A SYNC change is durable when it commits, so no capture is ever in flight (no HOLD_BUSY)."""
    if hold.state != ACTIVE:
        raise ENDED[hold.state](f"hold {hold.hold_id} is {hold.state.lower()} already")
    if op == EXPIRE and now_ms < hold.expires_at:
        raise errors.HoldNotDue("the hold has not expired yet")
    if op != EXPIRE and now_ms >= hold.expires_at:
        raise errors.HoldExpired(f"hold {hold.hold_id} expired")
    remaining = hold.amount - hold.captured
    take = (amount or remaining) if op == CAPTURE else 0
    if take > remaining:
        raise errors.CaptureExceedsHold(f"only {remaining} minor units are left on the hold")
    terminal = op != CAPTURE or final or take == remaining
    if not terminal:
        return take, 0, ACTIVE
    return take, remaining - take, {VOID: "VOIDED", EXPIRE: "EXPIRED"}.get(op, "CAPTURED")
