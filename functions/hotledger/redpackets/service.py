"""Red packets.

Send: the packet and its pre-split items (split.py) go to the DB as CREATING, the sender is debited through
the ledger (Idempotency-Key debit_key), then the packet opens (DB, then Redis: the list of unclaimed items).
Grab: one Lua script pops an item for a user who has not grabbed yet; the claim is made durable by the
configured transport (Durability.apply) and answered. The writer stamps claims in batches (persist.py) and
credits each grabber through the ledger (credit_key) once the DB accepted the claim, exactly once. At its expiry (delay queue PACKET_EXPIRY)
the unclaimed remainder is refunded to the sender (refund_key), exactly once. The reconciler (reconcile.py)
completes what a crash left half done: packets stuck in CREATING, claims whose event was lost, refunds not
made, grabs not credited.

Invariants:
- money moves only through the ledger, each move under its own Idempotency-Key, so repeating a step (the
  reconciler does) replays it instead of moving the money twice;
- the sender's debit = the items grabbed + the refund: an item is either claimed by one user or refunded;
- a grabber is credited only after the DB stamped the item with them: a claim the DB refuses (the item went to
  another grabber after a Redis loss) is never credited, so a packet never pays out more than its total;
- a refund begins only once the packet is closed to grabs and no claim is on its way to the DB;
- a packet Redis lost is rebuilt from the DB and grabs (and its refund) wait until the writer applied every
  claim the log held then (outbox/log_hold.py; at least REBUILD_HOLD_S), so no item claimed before the loss is
  handed out again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from hotledger import errors
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.delay_queue import DelayQueue
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.outbox.durable import Durability, Outbound, Step
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.outbox.log_hold import LogHold
from hotledger.redpackets.replies import ExpireStatus, GrabReply, GrabStatus
from hotledger.redpackets.rows import PacketRow
from hotledger.redpackets.split import split
from hotledger.redpackets.store import PacketCache, PacketStore, credit_key, debit_key, refund_key

if TYPE_CHECKING:
    from hotledger.ledger.service import LedgerResult

PACKET_EXPIRY = "redpacket-expiry"
EXPIRY_RETRY_MS = 2000
FINISHED = ("REFUNDED", "FAILED")  # no grab and no claim can change these any more
# the ledger did not move the money, or cannot say: the step is retried later under the same key
LEDGER_FAILURES = (errors.DomainError, RedisUnavailable, DatabaseUnavailable)


@dataclass(frozen=True)
class Grab:
    packet_id: int
    item_id: int
    user_id: int
    amount: int


@dataclass
class PacketView:
    packet_id: int
    sender_id: int
    state: str
    total: int
    count: int
    refund: int | None
    expires_at: int
    grabs: list[tuple[int, int]] = field(default_factory=list)  # (user id, amount) by user id


class Expiry(Enum):
    """What expire() did with a packet."""

    NOT_YET = "not_yet"  # not expired yet, or claims still on their way to the DB: look again later
    REBUILT = "rebuilt"  # Redis had lost it: rebuilt from the DB, look again later
    REFUND_FAILED = "refund_failed"  # REFUNDING, but the ledger did not credit the sender: retried with the same key
    REFUNDED = "refunded"  # the rest went back to the sender now
    SETTLED_BEFORE = "settled_before"  # an earlier run began (or finished) the refund

    @property
    def settled(self) -> bool:
        return self in (Expiry.REFUNDED, Expiry.SETTLED_BEFORE)


class Ledger(Protocol):
    """What red packets use of the ledger's service. Each move carries an Idempotency-Key: repeated, it replays."""

    def account_exists(self, user_id: int) -> bool: ...

    def deduct(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult: ...

    def recharge(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult: ...


def _debit_not_made(exc: errors.DomainError) -> bool:
    """Is the ledger's answer a definitive 'the debit was not made'? Its refusals (4xx: 402, 403, 404, 409 key
    reused, 422) and the 503s whose contract is 'nothing changed' (PUBLISH_FAILED: undone; SERVICE_UNAVAILABLE:
    the account could not be loaded; LOCK_LOST: fenced before writing). Not OUTCOME_UNKNOWN, and not
    IDEMPOTENCY_IN_PROGRESS: the first attempt under the key may still charge, nor RECOVERING: on an account rebuilt
    after a Redis loss, the key's first debit may still be on its way to the DB."""
    if isinstance(exc, (errors.ChargeOutcomeUnknown, errors.IdempotencyInProgress)):
        return False
    return exc.status < 500 or isinstance(exc, (errors.PublishFailed, errors.ServiceUnavailable, errors.FencedOut))


def _creation_unknown(packet_id: int, why: str, **details: str) -> errors.DomainError:
    return errors.ChargeOutcomeUnknown(
        f"{why}: red packet {packet_id} may or may not be created (its sender may or may not be debited). Check GET "
        f"/redpackets/{packet_id}: the reconciler opens it, or marks it FAILED if the debit was not made",
        **details,
        packet_id=str(packet_id),
    )


def _grab_unknown(packet_id: int, why: str) -> errors.DomainError:
    return errors.ChargeOutcomeUnknown(
        f"{why}: the grab may or may not be made. Check GET /redpackets/{packet_id} before trying again"
    )


_REFUSALS = {
    GrabStatus.ALREADY: lambda r: errors.AlreadyGrabbed(
        "this user grabbed from this red packet already", item_id=str(r.item_id)
    ),
    GrabStatus.EMPTY: lambda r: errors.PacketEmpty("every packet has been grabbed"),
    GrabStatus.EXPIRED: lambda r: errors.PacketExpired("the red packet has expired"),
    GrabStatus.NOT_OPEN: lambda r: errors.PacketNotOpen(f"the red packet is {r.detail}, not open"),
    GrabStatus.RECOVERING: lambda r: errors.Recovering(
        "the red packet is being restored after a cache failure; retry in a few seconds", retry_at=r.detail
    ),
    GrabStatus.HELD: lambda r: errors.Recovering(
        "the red packet is being restored after a cache failure: grabs made before "
        "it are still on their way to the DB; retry in a few seconds",
        retry_at=r.detail,
    ),
}


def _refusal(reply: GrabReply) -> errors.DomainError | None:
    refuse = _REFUSALS.get(reply.status)
    return refuse(reply) if refuse else None


def _now_ms() -> int:
    return int(time.time() * 1000)


class RedPackets:
    def __init__(
        self,
        store: PacketStore,
        cache: PacketCache,
        durability: Durability,
        next_id: Callable[[], int],
        ledger: Ledger,
        queue: DelayQueue,
        rebuild_hold_ms: int,
        hold: LogHold,
        rng: random.Random | None = None,
        clock: Callable[[], int] = _now_ms,
    ):
        self.store, self.cache, self.durability, self.next_id = store, cache, durability, next_id
        self.ledger, self.queue, self.rebuild_hold_ms, self.hold = ledger, queue, rebuild_hold_ms, hold
        self.rng = rng or random.SystemRandom()
        self.clock = clock
        self.senders: dict[int, int] = {}  # packet id -> its sender, as read (a packet's sender never changes)

    # send -----------------------------------------------------------------------------------------------
    def create(
        self,
        sender_id: int,
        total: int,
        count: int,
        expires_in_s: int,
        reserve: Callable[[int], object] | None = None,
        packet_id: int | None = None,
    ) -> PacketView:
        """Send a packet. `reserve(packet_id)` runs before any effect (an Idempotency-Key's recovery point: an attempt
        that takes the key over after this one died resumes this packet, see resume); `packet_id`: the id an earlier
        attempt reserved and never inserted."""
        amounts = split(total, count, self.rng)
        if not self.ledger.account_exists(sender_id):
            raise errors.AccountNotFound(f"account {sender_id} does not exist")
        packet_id = packet_id or self.next_id()
        if reserve is not None:
            reserve(packet_id)
        packet = PacketRow(packet_id, sender_id, "CREATING", total, count, None, self.clock() + expires_in_s * 1000)
        if not self.store.insert(
            packet.packet_id, sender_id, total, packet.expires_at, [(self.next_id(), a) for a in amounts]
        ):
            # an attempt that took the key over while this one stalled inserted it: finish the one packet as it does
            return self.resume(packet_id, sender_id, total, count, expires_in_s)
        self.debit_and_open(packet, first_debit=True)
        return PacketView(packet.packet_id, sender_id, "OPEN", total, count, None, packet.expires_at)

    def resume(self, packet_id: int, sender_id: int, total: int, count: int, expires_in_s: int) -> PacketView:
        """Finish the send an attempt that died began under the same Idempotency-Key with this packet id: create it if
        it never was inserted, debit (under the packet's own key rp<id>: at most once) and open it if it is CREATING,
        answer it if it is open or past. A FAILED packet was refused its debit: not sent."""
        row = self.store.packet(packet_id)
        if row is None:
            return self.create(sender_id, total, count, expires_in_s, packet_id=packet_id)
        if row.state == "FAILED":
            raise errors.PacketNotOpen(f"red packet {packet_id} failed: its sender's debit was refused")
        if row.state == "CREATING":
            self.debit_and_open(row)
        return PacketView(row.packet_id, row.sender_id, "OPEN", row.total, row.count, None, row.expires_at)

    def debit_and_open(self, packet: PacketRow, first_debit: bool = False) -> None:
        """Debit the sender (idempotent by key: the reconciler may run this again), then open the packet.
        Only a definitive answer that the debit was not made (_debit_not_made) marks the packet FAILED. Anything
        else - OUTCOME_UNKNOWN, a debit in progress, or any exception the ledger raised, which may come after the
        debit stood (a republish, an answer record, a lost reply) - leaves it CREATING and is answered
        OUTCOME_UNKNOWN naming the packet: the reconciler runs this again under the same key until the ledger
        answers (TigerBeetle's rule: a client without a definitive reply retries the same transfer id, which
        either exists already or is created once; it never assumes 'nothing happened'). So is a failure after
        the debit: the packet is finished by the reconciler, not failed.
        `first_debit`: the attempt that inserted the packet, so nothing was ever charged under its key: a sender's
        account that holds new keys after a Redis loss (RECOVERING) refused it, and the packet is taken back whole,
        as if never sent (a retry under the request's Idempotency-Key sends it anew)."""
        try:
            debit = self.ledger.deduct(packet.sender_id, packet.total, debit_key(packet.packet_id))
        except errors.DomainError as exc:
            if first_debit and isinstance(exc, errors.Recovering):
                self.store.discard(packet.packet_id)
                raise
            if not _debit_not_made(exc):
                raise _creation_unknown(packet.packet_id, exc.message, **exc.details) from exc
            self.store.mark_failed(packet.packet_id)
            raise
        except Exception as exc:
            raise _creation_unknown(packet.packet_id, f"the ledger failed ({type(exc).__name__}: {exc})") from exc
        try:
            self.store.mark_open(packet.packet_id, debit.entry_id)
            self.load(packet.packet_id, hold_until=0)
            self.cache.mark_open(packet.packet_id)  # a concurrent grab may have loaded it while CREATING
            self.queue.offer(PACKET_EXPIRY, str(packet.packet_id), due_at_ms=packet.expires_at)
        except Exception as exc:
            raise _creation_unknown(
                packet.packet_id, f"the sender was debited but opening the packet failed ({type(exc).__name__}: {exc})"
            ) from exc

    def refund_failed_debit(self, packet_id: int) -> bool:
        """A FAILED packet whose sender was debited after all gives the whole total back: REFUNDING (once, under
        the row lock), then the refund credit under rprefund<id> (finish_refund: once). False when there was
        nothing to begin, or the credit failed (it stays REFUNDING and is paid by a later run)."""
        return self.store.begin_failed_refund(packet_id) and self.finish_refund(packet_id)

    # Redis holds what grabs need --------------------------------------------------------------------------
    def load(self, packet_id: int, hold_until: int, hold_log: str = "") -> None:
        """Put the packet into Redis from the DB (no-op when Redis holds it). The packet row stays locked from
        the DB read until Redis holds the result, so a claim the writer commits meanwhile is either read here
        or found in the loaded list by its settle (persist.py)."""
        with self.store.transaction() as tx:
            row = tx.packet_for_update(packet_id)
            if row is None:
                raise errors.PacketNotFound(f"red packet {packet_id} does not exist")
            state, expires_at = row
            self.cache.load(packet_id, state, expires_at, hold_until, tx.items(packet_id), hold_log)
        if state in FINISHED:
            self.cache.retire(packet_id)

    def rebuild(self, packet_id: int) -> None:
        """Redis lost the packet: grabs wait until the writer applied the log as it was (at least REBUILD_HOLD_S),
        so claims acknowledged before the loss land first."""
        self.load(packet_id, hold_until=self.clock() + self.rebuild_hold_ms, hold_log=self.hold.rebuild_mark())

    def sender_of(self, packet_id: int) -> int | None:
        """The packet's sender (None: no such packet), read once per process: grabs are credited in its currency."""
        sender = self.senders.get(packet_id)
        if sender is None:
            row = self.store.packet(packet_id)
            if row is None:
                return None
            if len(self.senders) >= 100_000:
                self.senders.clear()
            sender = self.senders[packet_id] = row.sender_id
        return sender

    # grab -------------------------------------------------------------------------------------------------
    def grab(self, packet_id: int, user_id: int) -> Grab:
        if not self.ledger.account_exists(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        now = self.clock()

        def outbound(grab_id: int, reply: GrabReply) -> Outbound:
            claim = RedPacketClaimEvent(
                type="redpacket_claim",
                packet_id=packet_id,
                item_id=reply.item_id,
                user_id=user_id,
                amount=reply.amount,
                ts=now,
                grab_id=grab_id,
            )
            return Outbound(
                f"rp{packet_id}",
                claim.model_dump,
                lambda: self.undo_grab(packet_id, grab_id, reply.item_id, user_id, reply.amount),
            )

        def attempt(grab_id: int) -> GrabReply:
            reply = self.cache.grab(packet_id, user_id, grab_id, now)
            if reply.status is GrabStatus.HELD and self.hold.passed(self.cache.hold_key(packet_id)):
                reply = self.cache.grab(packet_id, user_id, grab_id, now)  # the first call changed nothing
            return reply

        _, reply = self.durability.apply(
            Step(
                what=f"grab of red packet {packet_id}",
                attempt=attempt,
                reload=lambda: self.rebuild(packet_id),
                refusal=_refusal,
                outbound=outbound,
                unknown=lambda _grab_id, why: _grab_unknown(packet_id, why),
            )
        )
        return Grab(packet_id, reply.item_id, user_id, reply.amount)

    def undo_grab(self, packet_id: int, grab_id: int, item_id: int, user_id: int, amount: int) -> bool:
        """Take back a grab whose claim the broker did not acknowledge; True when it stands instead. The DB
        decides first, under the locks the writer stamps claims under (stamped already: it stands; otherwise
        rolled back for good), and only then is the item put back in Redis: one winner whatever Redis lost (the
        ledger's rule, ledger/service.py _undo; TigerBeetle's void vs post)."""
        with self.store.transaction() as tx:
            if tx.record_rollback(packet_id, item_id, grab_id, user_id):
                return True
        self.cache.rollback(packet_id, grab_id, item_id, user_id, amount)
        return False

    def credit_grab(self, user_id: int, item_id: int, amount: int) -> bool:
        """The DB holds the claim (the writer committed it): credit the grabber. False when that failed: the
        reconciler credits later under the same key."""
        try:
            self.ledger.recharge(user_id, amount, credit_key(item_id))
        except LEDGER_FAILURES:
            return False
        return True

    # expiry -----------------------------------------------------------------------------------------------
    def expire_due(self, packet_ids: list[str]) -> None:
        """Delay-queue handler: refund expired packets at their expiry. One not settled yet (claims still on
        their way to the DB, a rebuild, a failed credit) is offered again a little later; the reconciler's
        scan stays the safety net."""
        for packet_id in packet_ids:
            if not self.expire(int(packet_id), self.clock()).settled:
                self.queue.offer(PACKET_EXPIRY, packet_id, delay_ms=EXPIRY_RETRY_MS)

    def expire(self, packet_id: int, now_ms: int) -> Expiry:
        """Close an expired packet to grabs and refund its unclaimed rest, once no claim is in flight."""
        reply = self.cache.expire(packet_id, now_ms)
        if reply.missing:
            self.rebuild(packet_id)
            return Expiry.REBUILT
        if reply.status is not ExpireStatus.EXPIRED or reply.claims_pending > 0 or now_ms < reply.hold_until:
            return Expiry.NOT_YET
        if reply.hold_log and not self.hold.passed(self.cache.hold_key(packet_id)):
            return Expiry.NOT_YET  # claims made before a loss may still be on their way: no refund of their items
        if not self.store.begin_refund(packet_id):
            return Expiry.SETTLED_BEFORE
        return Expiry.REFUNDED if self.finish_refund(packet_id) else Expiry.REFUND_FAILED

    def finish_refund(self, packet_id: int) -> bool:
        """Credit a REFUNDING packet's refund to the sender (once: a t_pay row with its key means it was made),
        then mark it REFUNDED and retire its keys. False when the credit failed: it stays REFUNDING."""
        packet = self.store.packet(packet_id)
        if packet is None:  # never: a packet is refunded once its row is REFUNDING
            raise errors.PacketNotFound(f"red packet {packet_id} does not exist")
        if packet.refund and not self.store.refund_paid(packet_id, packet.sender_id):
            try:
                self.ledger.recharge(packet.sender_id, packet.refund, refund_key(packet_id))
            except LEDGER_FAILURES:
                return False
        self.store.mark_refunded(packet_id)
        self.cache.retire(packet_id)
        return True

    # read -------------------------------------------------------------------------------------------------
    def get(self, packet_id: int) -> PacketView:
        packet = self.store.packet(packet_id)
        if packet is None:
            raise errors.PacketNotFound(f"red packet {packet_id} does not exist")
        view = PacketView(
            packet_id, packet.sender_id, packet.state, packet.total, packet.count, packet.refund, packet.expires_at
        )
        # Redis knows grabs the writer has not persisted yet; a CREATING packet has none
        view.grabs = (self.cache.grabs(packet_id) if packet.state != "CREATING" else []) or self.store.persisted_grabs(
            packet_id
        )
        return view

    def pending_claims(self, packet_id: int) -> list[RedPacketClaimEvent]:
        """Grabs whose claim is not in the DB yet (the reconciler persists the stale ones)."""
        return self.cache.pending_claims(packet_id)
