"""Red packets.

Create: the packet and its pre-split items go to the DB as CREATING, the sender is debited through the
billing path (Idempotency-Key rp<packet id>), then the packet opens (DB, then Redis list of unclaimed items).
Grab: one Lua script pops an item for a user who has not grabbed yet; the claim is made durable by the
configured transport, then the grabber is credited through the billing path (Idempotency-Key rp<item id>),
exactly once. The writer stamps claims in batches. At its expiry (delay queue PACKET_EXPIRY) the packet's
unclaimed remainder is refunded (Idempotency-Key rprefund<packet id>), exactly once. The reconciler completes
what a crash left half done: packets stuck in CREATING, grabs not credited, refunds not made.
"""
from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

import redis

from hotledger import errors, keys
from hotledger.config import Settings
from hotledger.dal import db
from hotledger.dal.redis_store import RedisUnavailable, expire_once, text
from hotledger.outbox.durable import Durability, Outbound
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.writer import PersistReport, dedupe_and_claim, rejected
from hotledger.redpackets.store import GrabReply, GrabStatus, PacketScripts, packet_keys

MIN_ITEM = 1  # one cent
PACKET_EXPIRY = "redpacket-expiry"
EXPIRY_RETRY_MS = 2000


def split(total: int, count: int, rng: random.Random) -> list[int]:
    """Double-mean split: each item is uniform in [1, 2 x the mean of what is left], keeping at least one cent
    for every item still to come. Every item >= 1 cent and the items sum to total exactly."""
    if count <= 0 or total < count * MIN_ITEM:
        raise errors.TotalTooSmall(f"the total must be at least {count} x 0.01")
    items, left = [], total
    for remaining in range(count, 1, -1):
        high = min(2 * left // remaining, left - (remaining - 1) * MIN_ITEM)
        amount = rng.randint(MIN_ITEM, max(MIN_ITEM, high))
        items.append(amount)
        left -= amount
    items.append(left)
    return items


def debit_key(packet_id: int) -> str:
    return f"rp{packet_id}"


def credit_key(item_id: int) -> str:
    return f"rp{item_id}"


def refund_key(packet_id: int) -> str:
    return f"rprefund{packet_id}"


@dataclass(frozen=True)
class Grab:
    packet_id: int
    item_id: int
    user_id: int
    amount: int
    credited: bool


@dataclass
class PacketView:
    packet_id: int
    sender_id: int
    state: str
    total: int
    count: int
    refund: int | None
    expires_at: int
    grabs: list[tuple[int, int]] = field(default_factory=list)


def _grab_unknown(packet_id: int, why: str) -> errors.DomainError:
    return errors.ChargeOutcomeUnknown(f"{why}: the grab may or may not be made. Check GET /redpackets/{packet_id} "
                                       "before trying again")


_REFUSALS = {
    GrabStatus.ALREADY: lambda r: errors.AlreadyGrabbed("this user grabbed from this red packet already",
                                                        item_id=str(r.item_id)),
    GrabStatus.EMPTY: lambda r: errors.PacketEmpty("every packet has been grabbed"),
    GrabStatus.EXPIRED: lambda r: errors.PacketExpired("the red packet has expired"),
    GrabStatus.NOT_OPEN: lambda r: errors.PacketNotOpen(f"the red packet is {r.detail}, not open"),
    GrabStatus.RECOVERING: lambda r: errors.Recovering("the red packet is being restored after a cache failure; retry in a "
                                                       "few seconds", retry_at=r.detail),
}


def _refusal(reply: GrabReply) -> errors.DomainError | None:
    refuse = _REFUSALS.get(reply.status)
    return refuse(reply) if refuse else None


FINISHED = ("REFUNDED", "FAILED")  # no grab and no claim can change these any more


class RedPackets:
    def __init__(self, cfg: Settings, scripts, ids, publish, billing, delay_queue, rng: random.Random | None = None):
        self.cfg, self.scripts, self.redis, self.ids, self.billing = cfg, scripts, scripts.client, ids, billing
        self.queue = delay_queue
        self.durability = Durability(cfg, publish, ids.next_id)
        self.lua = PacketScripts(scripts, self.durability.stream_flag, cfg.entry_ttl_s)
        self.rng = rng or random.SystemRandom()

    # create ---------------------------------------------------------------------------------------------
    def create(self, sender_id: int, total: int, count: int, expires_in_s: int) -> PacketView:
        amounts = split(total, count, self.rng)
        if not db.query("SELECT 1 FROM t_user WHERE id = %s", (sender_id,)):
            raise errors.AccountNotFound(f"account {sender_id} does not exist")
        packet_id = self.ids.next_id()
        expires_at = int(time.time() * 1000) + expires_in_s * 1000
        with db.transaction() as cur:
            cur.execute("INSERT INTO t_red_packet (id, sender_id, total, item_count, state, expires_at)"
                        " VALUES (%s, %s, %s, %s, 'CREATING', %s)", (packet_id, sender_id, total, count, db.to_datetime(expires_at)))
            cur.execute("INSERT INTO t_red_packet_item (id, packet_id, amount) VALUES "
                        + ",".join("(%d,%d,%d)" % (self.ids.next_id(), packet_id, a) for a in amounts))
        self._debit_and_open(packet_id, sender_id, total, expires_at)
        return PacketView(packet_id, sender_id, "OPEN", total, count, None, expires_at)

    def _debit_and_open(self, packet_id: int, sender_id: int, total: int, expires_at: int) -> None:
        """Debit the sender (idempotent by key: the reconciler may run this again), then open the packet.
        A refusal (402, 403, ...) or a failure that changed nothing marks the packet FAILED; an unknown outcome
        leaves it CREATING for the reconciler to finish."""
        try:
            result = self.billing.deduct(sender_id, total, debit_key(packet_id))
        except errors.DomainError as exc:
            if exc.code != "OUTCOME_UNKNOWN":
                db.execute("UPDATE t_red_packet SET state = 'FAILED' WHERE id = %s AND state = 'CREATING'", (packet_id,))
            raise
        except (redis.RedisError, RedisUnavailable, db.DatabaseUnavailable):  # refused before the charge: it never ran
            db.execute("UPDATE t_red_packet SET state = 'FAILED' WHERE id = %s AND state = 'CREATING'", (packet_id,))
            raise
        db.execute("UPDATE t_red_packet SET state = 'OPEN', debit_order_id = %s WHERE id = %s AND state = 'CREATING'",
                   (result.entry_id, packet_id))
        self.load(packet_id, hold_until=0)
        self.redis.hset(keys.packet(packet_id), "state", "OPEN")  # loaded while CREATING by a concurrent grab
        self.queue.offer(PACKET_EXPIRY, str(packet_id), due_at_ms=expires_at)

    def expire_due(self, packet_ids: list[str]) -> None:
        """Delay-queue handler: refund expired packets at their expiry. One whose claims are still on their way
        to the DB is offered again a little later; the reconciler's scan stays the safety net."""
        for packet_id in packet_ids:
            if not _expire(self, int(packet_id), int(time.time() * 1000), PacketReconcileReport()):
                self.queue.offer(PACKET_EXPIRY, packet_id, delay_ms=EXPIRY_RETRY_MS)

    def load(self, packet_id: int, hold_until: int) -> None:
        """Put the packet into Redis from the DB (no-op when Redis holds it)."""
        with db.transaction() as cur:
            cur.execute("SELECT state, expires_at FROM t_red_packet WHERE id = %s FOR UPDATE", (packet_id,))
            row = cur.fetchone()
            if row is None:
                raise errors.PacketNotFound(f"red packet {packet_id} does not exist")
            state, expires_at = row
            cur.execute("SELECT id, amount, user_id, claim_time FROM t_red_packet_item WHERE packet_id = %s ORDER BY id",
                        (packet_id,))
            items = cur.fetchall()
            unclaimed = [f"{i};{a}" for i, a, user, _ in items if user is None]
            grabbers = [x for i, a, user, at in items if user is not None for x in (user, f"{i};{a};{db.to_ms(at)};")]
            self.scripts.redpacket_load(keys=packet_keys(packet_id),
                                        args=[state, db.to_ms(expires_at), hold_until, len(unclaimed), *unclaimed, *grabbers])
        if state in FINISHED:
            self.retire(packet_id)

    def retire(self, packet_id: int) -> None:
        """A finished packet's keys leave Redis after FINISHED_KEYS_TTL_S (a late grab reloads them, then EXPIRED)."""
        expire_once(self.redis, [*packet_keys(packet_id), keys.packet_pending(packet_id)], self.cfg.finished_keys_ttl_s)

    def rebuild(self, packet_id: int) -> None:
        """Redis lost the packet: grabs wait REBUILD_HOLD_S so claims acknowledged before the loss land first."""
        self.load(packet_id, hold_until=int(time.time() * 1000) + self.cfg.rebuild_hold_s * 1000)

    # grab -------------------------------------------------------------------------------------------------
    def grab(self, packet_id: int, user_id: int) -> Grab:
        if not self.billing.account_exists(user_id):
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        now = int(time.time() * 1000)

        def outbound(grab_id: int, reply: GrabReply) -> Outbound:
            claim = RedPacketClaimEvent(type="redpacket_claim", packet_id=packet_id, item_id=reply.item_id, user_id=user_id,
                                        amount=reply.amount, ts=now, grab_id=grab_id)
            return Outbound(f"rp{packet_id}", claim.model_dump,
                            lambda: self.lua.rollback(packet_id, grab_id, reply.item_id, user_id, reply.amount))

        _, reply = self.durability.apply(
            lambda grab_id: self.lua.grab(packet_id, user_id, grab_id, now), reload=lambda: self.rebuild(packet_id),
            refusal=_refusal, outbound=outbound, unknown=lambda _grab_id, why: _grab_unknown(packet_id, why),
            what=f"grab of red packet {packet_id}")
        return Grab(packet_id, reply.item_id, user_id, reply.amount, self._credit(user_id, reply.item_id, reply.amount))

    def _credit(self, user_id: int, item_id: int, amount: int) -> bool:
        """The claim is durable: credit the grabber now. If that fails the reconciler credits later (same key)."""
        try:
            self.billing.recharge(user_id, amount, credit_key(item_id))
        except (errors.DomainError, redis.RedisError, RedisUnavailable, db.DatabaseUnavailable):
            return False
        return True

    # read ------------------------------------------------------------------------------------------------
    def get(self, packet_id: int) -> PacketView:
        rows = db.query("SELECT sender_id, state, total, item_count, refund, expires_at FROM t_red_packet WHERE id = %s",
                        (packet_id,))
        if not rows:
            raise errors.PacketNotFound(f"red packet {packet_id} does not exist")
        sender_id, state, total, count, refund, expires_at = rows[0]
        view = PacketView(packet_id, sender_id, state, total, count, refund, db.to_ms(expires_at))
        grabbers = self.redis.hgetall(keys.packet_grabbers(packet_id)) if state != "CREATING" else {}
        if grabbers:  # Redis knows grabs the writer has not persisted yet
            view.grabs = sorted((int(user), int(text(value).split(";")[1])) for user, value in grabbers.items())
        else:
            view.grabs = [tuple(r) for r in db.query("SELECT user_id, amount FROM t_red_packet_item WHERE packet_id = %s"
                                                      " AND user_id IS NOT NULL ORDER BY user_id", (packet_id,))]
        return view

    def pending_claims(self, packet_id: int) -> list[RedPacketClaimEvent]:
        claims = []
        for item_id, value in self.redis.hgetall(keys.packet_pending(packet_id)).items():
            user_id, amount, ts, grab_id = text(value).split(";")
            claims.append(RedPacketClaimEvent(type="redpacket_claim", packet_id=packet_id, item_id=int(item_id),
                                              user_id=int(user_id), amount=int(amount), ts=int(ts), grab_id=int(grab_id)))
        return claims


class RedPacketPersister:
    """Writer side: claims -> UPDATE t_red_packet_item SET user_id for many items at once, exactly once."""

    def __init__(self, scripts, outbox: OutboxStore):
        self.scripts, self.outbox = scripts, outbox

    def persist(self, events: list[RedPacketClaimEvent]) -> PersistReport:
        report = PersistReport()
        claimed, report.duplicates, report.rolled_back = dedupe_and_claim(
            self.outbox, events, lambda e: e.grab_id, lambda e: e.packet_id, lambda p, e: keys.packet_fate(p, e.grab_id))
        fresh, settled = [], []
        with db.transaction() as cur:
            rows = {}
            if claimed:
                # a shared lock on the packets orders this commit against a rebuild (load() holds the row
                # exclusively from its DB read until Redis holds the result): either the rebuild reads this
                # claim, or redpacket_settle finds the rebuilt list and takes the item out of it
                packet_ids = sorted({e.packet_id for e in claimed})
                cur.execute(f"SELECT id FROM t_red_packet WHERE id IN ({','.join(['%s'] * len(packet_ids))})"
                            " ORDER BY id LOCK IN SHARE MODE", packet_ids)
                cur.execute(f"SELECT id, packet_id, user_id, amount, refunded FROM t_red_packet_item WHERE id IN"
                            f" ({','.join(['%s'] * len(claimed))}) ORDER BY id FOR UPDATE", [e.item_id for e in claimed])
                rows = {row[0]: row[1:] for row in cur.fetchall()}
            dead = []
            for e in claimed:
                row = rows.get(e.item_id)
                if row is None or row[0] != e.packet_id or row[2] != e.amount:
                    dead.append(rejected(f"rp{e.packet_id}", e.item_id, e, "no such red packet item"))
                elif row[1] == e.user_id:
                    report.duplicates += 1
                    settled.append(e)
                elif row[1] is not None or row[3]:
                    dead.append(rejected(f"rp{e.packet_id}", e.item_id, e, "item already grabbed by another user or refunded"))
                else:
                    fresh.append(e)
            if fresh:
                ids = ",".join("%d" % e.item_id for e in fresh)
                cur.execute("UPDATE t_red_packet_item SET user_id = CASE id "
                            + " ".join("WHEN %d THEN %d" % (e.item_id, e.user_id) for e in fresh)
                            + " END, claim_time = CASE id "
                            + " ".join("WHEN %d THEN FROM_UNIXTIME(%d/1000)" % (e.item_id, e.ts) for e in fresh)
                            + f" END WHERE id IN ({ids}) AND user_id IS NULL")
            report.dead_lettered = self.outbox.dead_letter(cur, dead)
        report.applied = len(fresh)
        self._settle([*fresh, *settled])
        return report

    def _settle(self, events: list[RedPacketClaimEvent]) -> None:
        by_packet = defaultdict(list)
        for e in events:
            by_packet[e.packet_id].append(e)
        if not by_packet:
            return
        pipe = self.scripts.client.pipeline(transaction=False)
        for packet_id, group in by_packet.items():
            self.scripts.redpacket_settle(
                keys=[keys.packet_unclaimed(packet_id), keys.packet_grabbers(packet_id), keys.packet_pending(packet_id)],
                args=[x for e in group for x in (e.item_id, e.user_id, e.amount, e.ts)], client=pipe)
        pipe.execute()


@dataclass
class PacketReconcileReport:
    opened: int = 0
    failed: int = 0
    compensated: int = 0
    credited: int = 0
    refunded: int = 0
    rebuilt: int = 0


PAGE = 500


def reconcile_packets(packets: RedPackets, persister: RedPacketPersister, now_ms: int, age_s: int) -> PacketReconcileReport:
    report = PacketReconcileReport()
    cutoff = db.to_datetime(now_ms - age_s * 1000)
    for packet_id, sender_id, total, expires_at in db.query(
            "SELECT id, sender_id, total, expires_at FROM t_red_packet WHERE state = 'CREATING' AND create_time < %s LIMIT %s",
            (cutoff, PAGE)):
        try:
            packets._debit_and_open(packet_id, sender_id, total, db.to_ms(expires_at))
            report.opened += 1
        except errors.DomainError:
            report.failed += 1
    for (packet_id,) in db.query("SELECT id FROM t_red_packet WHERE state = 'OPEN' ORDER BY id"):
        stale = [c for c in packets.pending_claims(packet_id) if c.ts < now_ms - age_s * 1000]
        if stale:  # their event was lost: persist from Redis
            report.compensated += persister.persist(stale).applied
        _expire(packets, packet_id, now_ms, report)
    for (packet_id,) in db.query("SELECT id FROM t_red_packet WHERE state = 'REFUNDING' LIMIT %s", (PAGE,)):
        _finish_refund(packets, packet_id, report)
    _credit_grabbers(packets, cutoff, report)
    return report


def _expire(packets: RedPackets, packet_id: int, now_ms: int, report: PacketReconcileReport) -> bool:
    """Refund an expired packet's rest once no claim is in flight. True when the packet is settled."""
    reply = packets.scripts.redpacket_expire(keys=[keys.packet(packet_id), keys.packet_pending(packet_id)], args=[now_ms])
    status = text(reply[0])
    if status == "missing":
        packets.rebuild(packet_id)
        report.rebuilt += 1
        return False
    if status != "expired" or int(reply[1]) > 0 or now_ms < int(reply[2]):
        return False  # still open, or claims still on their way to the DB
    with db.transaction() as cur:
        cur.execute("SELECT state FROM t_red_packet WHERE id = %s FOR UPDATE", (packet_id,))
        if cur.fetchone()[0] != "OPEN":
            return True
        cur.execute("SELECT COALESCE(SUM(amount), 0) FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NULL",
                    (packet_id,))
        (refund,) = cur.fetchone()
        cur.execute("UPDATE t_red_packet_item SET refunded = 1 WHERE packet_id = %s AND user_id IS NULL", (packet_id,))
        cur.execute("UPDATE t_red_packet SET state = 'REFUNDING', refund = %s WHERE id = %s", (int(refund), packet_id))
    return _finish_refund(packets, packet_id, report)


def _finish_refund(packets: RedPackets, packet_id: int, report: PacketReconcileReport) -> bool:
    """Credit the refund to the sender (idempotent by key; a t_pay row with the key means it is done)."""
    sender_id, refund = db.query("SELECT sender_id, refund FROM t_red_packet WHERE id = %s", (packet_id,))[0]
    done = db.query("SELECT 1 FROM t_pay WHERE idem_key = %s AND user_id = %s", (refund_key(packet_id), sender_id))
    if refund and not done:
        try:
            packets.billing.recharge(sender_id, refund, refund_key(packet_id))
        except (errors.DomainError, redis.RedisError, RedisUnavailable, db.DatabaseUnavailable):
            return False  # stays REFUNDING: retried with the same key
    db.execute("UPDATE t_red_packet SET state = 'REFUNDED' WHERE id = %s AND state = 'REFUNDING'", (packet_id,))
    packets.retire(packet_id)
    report.refunded += 1
    return True


def _credit_grabbers(packets: RedPackets, cutoff, report: PacketReconcileReport) -> None:
    """Grabs claimed in the DB whose credit is not in t_pay: mark the credited ones, credit the rest again
    (same key: a credit still on its way replays instead of paying twice)."""
    rows = db.query("SELECT i.id, i.user_id, i.amount, p.id IS NOT NULL FROM t_red_packet_item i"
                    " LEFT JOIN t_pay p ON p.idem_key = CONCAT('rp', i.id) AND p.user_id = i.user_id"
                    " WHERE i.credited = 0 AND i.user_id IS NOT NULL AND i.claim_time < %s LIMIT %s", (cutoff, PAGE))
    done = [item_id for item_id, _, _, in_pay in rows if in_pay]
    if done:
        db.execute(f"UPDATE t_red_packet_item SET credited = 1 WHERE id IN ({','.join(['%s'] * len(done))})", done)
    for item_id, user_id, amount, in_pay in rows:
        if in_pay:
            continue
        if not packets._credit(user_id, item_id, amount):
            break  # the broker or Redis is down: one failed credit (a publish timeout) per run, not hundreds
        report.credited += 1
