"""Red packets' storage. Nothing above this module writes SQL or speaks to redis-py for red packets.

- PacketStore: the DB side, t_red_packet and t_red_packet_item (and one read of the ledger's t_pay). Its
  methods are whole operations (each its own transaction), except where a caller must decide, or reach
  Redis, while rows stay locked: those run inside `transaction()`, whose PacketTx has the statements.
- PacketCache: the Redis side (keys tagged {rp<id>}: one slot per packet): one typed method per
  redpacket_*.lua script, and the few raw reads and writes of the packet's keys.
Failures surface as DatabaseUnavailable / RedisUnavailable (nothing ran) or their OutcomeUnknown subclasses.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, expire_once, redis_errors_translated, text
from hotledger.ledger.entry import ServiceKey
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.redpackets.replies import ExpireReply, GrabReply
from hotledger.redpackets.rows import ClaimedItem, ItemRow, PacketRow
from hotledger.redpackets.tx import PacketTx, _marks

# The Idempotency-Keys of the packet's moves through the ledger. t_pay rows carry them, which is how the
# reconciler tells a credit or a refund that was made from one that was not.
CREDIT_KEY_PREFIX = "rp"


DEBIT_KEY_PREFIX = "rp"  # the debit is in t_order, the credits in t_pay: one prefix, two tables


def debit_key(packet_id: int) -> ServiceKey:
    return ServiceKey(f"{DEBIT_KEY_PREFIX}{packet_id}")


def credit_key(item_id: int) -> ServiceKey:
    return ServiceKey(f"{CREDIT_KEY_PREFIX}{item_id}")


def refund_key(packet_id: int) -> ServiceKey:
    return ServiceKey(f"rprefund{packet_id}")


def _refund_unclaimed(cur: db.Cursor, packet_id: int) -> int:
    """In the caller's transaction (the packet row locked): mark the packet's unclaimed items refunded and answer
    their sum, the packet's refund."""
    cur.execute(
        "SELECT COALESCE(SUM(amount), 0) FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NULL", (packet_id,)
    )
    (refund,) = cur.fetchone()
    cur.execute("UPDATE t_red_packet_item SET refunded = 1 WHERE packet_id = %s AND user_id IS NULL", (packet_id,))
    return int(refund)


class PacketStore:
    @contextlib.contextmanager
    def transaction(self) -> Iterator[PacketTx]:
        with db.transaction() as cur:
            yield PacketTx(cur)

    def insert(self, packet_id: int, sender_id: int, total: int, expires_at: int, items: list[tuple[int, int]]) -> bool:
        """The packet as CREATING with its pre-split items ((item id, amount)), together; False when a packet with
        this id is there already (another attempt under the same Idempotency-Key inserted it: nothing is added)."""
        with db.transaction() as cur:
            cur.execute(
                "INSERT INTO t_red_packet (id, sender_id, total, item_count, state, expires_at)"
                " VALUES (%s, %s, %s, %s, 'CREATING', %s) ON DUPLICATE KEY UPDATE id = id",
                (packet_id, sender_id, total, len(items), db.to_datetime(expires_at)),
            )
            if cur.rowcount == 0:
                return False
            cur.execute(
                "INSERT INTO t_red_packet_item (id, packet_id, amount) VALUES "
                + ",".join("(%d,%d,%d)" % (item_id, packet_id, amount) for item_id, amount in items)
            )
        return True

    @staticmethod
    def discard(packet_id: int) -> None:
        """A CREATING packet whose first debit was refused before anything was charged under its key: gone."""
        with db.transaction() as cur:
            cur.execute("DELETE FROM t_red_packet WHERE id = %s AND state = 'CREATING'", (packet_id,))
            if cur.rowcount:
                cur.execute("DELETE FROM t_red_packet_item WHERE packet_id = %s", (packet_id,))

    @staticmethod
    def mark_failed(packet_id: int) -> None:
        db.execute("UPDATE t_red_packet SET state = 'FAILED' WHERE id = %s AND state = 'CREATING'", (packet_id,))

    @staticmethod
    def mark_open(packet_id: int, debit_entry_id: int) -> None:
        db.execute(
            "UPDATE t_red_packet SET state = 'OPEN', debit_order_id = %s WHERE id = %s AND state = 'CREATING'",
            (debit_entry_id, packet_id),
        )

    @staticmethod
    def begin_refund(packet_id: int) -> bool:
        """OPEN -> REFUNDING: the unclaimed items are marked refunded and their sum becomes the refund, at once.
        False when the packet is not OPEN (another run began or finished its refund)."""
        with db.transaction() as cur:
            cur.execute("SELECT state FROM t_red_packet WHERE id = %s FOR UPDATE", (packet_id,))
            if cur.fetchone()[0] != "OPEN":
                return False
            refund = _refund_unclaimed(cur, packet_id)
            cur.execute("UPDATE t_red_packet SET state = 'REFUNDING', refund = %s WHERE id = %s", (refund, packet_id))
        return True

    @staticmethod
    def begin_failed_refund(packet_id: int) -> bool:
        """FAILED -> REFUNDING for a packet whose sender was debited after all (t_order holds the debit under its
        key): every item is marked refunded and their sum (the total: a FAILED packet never opened) becomes the
        refund, at once. False when the packet is not FAILED (another run began the refund) or holds no debit."""
        with db.transaction() as cur:
            cur.execute("SELECT state, sender_id FROM t_red_packet WHERE id = %s FOR UPDATE", (packet_id,))
            row = cur.fetchone()
            if row is None or row[0] != "FAILED":
                return False
            cur.execute("SELECT id FROM t_order WHERE idem_key = %s AND user_id = %s", (debit_key(packet_id), row[1]))
            debit = cur.fetchone()
            if debit is None:
                return False
            refund = _refund_unclaimed(cur, packet_id)
            cur.execute(
                "UPDATE t_red_packet SET state = 'REFUNDING', refund = %s, debit_order_id = %s WHERE id = %s",
                (refund, debit[0], packet_id),
            )
        return True

    @staticmethod
    def mark_refunded(packet_id: int) -> None:
        db.execute("UPDATE t_red_packet SET state = 'REFUNDED' WHERE id = %s AND state = 'REFUNDING'", (packet_id,))

    @staticmethod
    def packet(packet_id: int) -> PacketRow | None:
        rows = db.query(
            "SELECT sender_id, state, total, item_count, refund, expires_at FROM t_red_packet WHERE id = %s",
            (packet_id,),
        )
        if not rows:
            return None
        sender_id, state, total, count, refund, expires_at = rows[0]
        return PacketRow(packet_id, sender_id, state, total, count, refund, db.to_ms(expires_at))

    @staticmethod
    def persisted_grabs(packet_id: int) -> list[tuple[int, int]]:
        """(user id, amount) of the claims the DB holds, by user id."""
        return [
            tuple(r)
            for r in db.query(
                "SELECT user_id, amount FROM t_red_packet_item WHERE packet_id = %s"
                " AND user_id IS NOT NULL ORDER BY user_id",
                (packet_id,),
            )
        ]

    # the reconciler's reads ------------------------------------------------------------------------------
    @staticmethod
    def creating(created_before: int, limit: int) -> list[PacketRow]:
        rows = db.query(
            "SELECT id, sender_id, total, item_count, expires_at FROM t_red_packet WHERE state = 'CREATING'"
            " AND create_time < %s LIMIT %s",
            (db.to_datetime(created_before), limit),
        )
        return [
            PacketRow(i, sender, "CREATING", total, count, None, db.to_ms(at)) for i, sender, total, count, at in rows
        ]

    @staticmethod
    def open_ids(after_id: int = 0, limit: int = 2**62) -> list[int]:
        """The next page of OPEN packets after `after_id`, by id."""
        return [
            packet_id
            for (packet_id,) in db.query(
                "SELECT id FROM t_red_packet WHERE state = 'OPEN' AND id > %s ORDER BY id LIMIT %s", (after_id, limit)
            )
        ]

    @staticmethod
    def failed_with_debit(limit: int) -> list[int]:
        """FAILED packets whose sender's debit the ledger holds after all; the join reads the ledger's t_order by
        debit_key() (idx_order_idem). A debit still pending in Redis shows up once the writer persisted it."""
        return [
            packet_id
            for (packet_id,) in db.query(
                "SELECT p.id FROM t_red_packet p JOIN t_order o ON o.idem_key = CONCAT(%s, p.id) AND o.user_id = p.sender_id"
                " WHERE p.state = 'FAILED' ORDER BY p.id LIMIT %s",
                (DEBIT_KEY_PREFIX, limit),
            )
        ]

    @staticmethod
    def refunding_ids(limit: int) -> list[int]:
        return [
            packet_id
            for (packet_id,) in db.query("SELECT id FROM t_red_packet WHERE state = 'REFUNDING' LIMIT %s", (limit,))
        ]

    @staticmethod
    def refund_paid(packet_id: int, sender_id: int) -> bool:
        """Reads the ledger's table: is the refund's credit (its Idempotency-Key) in t_pay?"""
        return bool(
            db.query("SELECT 1 FROM t_pay WHERE idem_key = %s AND user_id = %s", (refund_key(packet_id), sender_id))
        )

    @staticmethod
    def uncredited_claims(claimed_before: int, limit: int) -> list[ClaimedItem]:
        """Claims the DB holds whose credit is not marked yet; the join reads the ledger's t_pay by credit_key()."""
        rows = db.query(
            "SELECT i.id, i.user_id, i.amount, p.id IS NOT NULL FROM t_red_packet_item i"
            " LEFT JOIN t_pay p ON p.idem_key = CONCAT(%s, i.id) AND p.user_id = i.user_id"
            " WHERE i.credited = 0 AND i.user_id IS NOT NULL AND i.claim_time < %s"
            " ORDER BY i.claim_time, i.id LIMIT %s",
            (CREDIT_KEY_PREFIX, db.to_datetime(claimed_before), limit),
        )
        return [ClaimedItem(item_id, user_id, amount, bool(in_pay)) for item_id, user_id, amount, in_pay in rows]

    @staticmethod
    def mark_credited(item_ids: list[int]) -> None:
        if item_ids:
            db.execute(f"UPDATE t_red_packet_item SET credited = 1 WHERE id IN ({_marks(len(item_ids))})", item_ids)


# Redis ---------------------------------------------------------------------------------------------------
def packet_keys(packet_id: int) -> list[str]:
    return [keys.packet(packet_id), keys.packet_unclaimed(packet_id), keys.packet_grabbers(packet_id)]


@redis_errors_translated
class PacketCache:
    def __init__(self, lua: Lua, stream_flag: str, fate_ttl_s: int, finished_keys_ttl_s: int):
        self.lua, self.stream_flag = lua, stream_flag
        self.fate_ttl_s, self.finished_keys_ttl_s = fate_ttl_s, finished_keys_ttl_s

    # one method per script ----------------------------------------------------------------------------
    def grab(self, packet_id: int, user_id: int, grab_id: int, now_ms: int) -> GrabReply:
        return GrabReply.parse(
            self.lua.run(
                "redpacket_grab",
                [*packet_keys(packet_id), keys.packet_pending(packet_id), keys.packet_stream(packet_id)],
                [packet_id, user_id, now_ms, grab_id, self.stream_flag],
            )
        )

    def rollback(self, packet_id: int, grab_id: int, item_id: int, user_id: int, amount: int) -> None:
        """Put back in Redis a grab the DB recorded as rolled back (PacketTx.record_rollback)."""
        self.lua.run(
            "redpacket_rollback",
            [
                keys.packet_unclaimed(packet_id),
                keys.packet_grabbers(packet_id),
                keys.packet_pending(packet_id),
                keys.packet_fate(packet_id, grab_id),
            ],
            [item_id, user_id, amount, self.fate_ttl_s],
        )

    def load(
        self, packet_id: int, state: str, expires_at: int, hold_until: int, items: list[ItemRow], hold_log: str = ""
    ) -> bool:
        """Put the packet and its items (unclaimed ones to hand out, claimed ones as grabs) into Redis, unless
        Redis holds it; True when loaded. Grabs answer RECOVERING until hold_until (epoch ms, 0: no hold), and
        while `hold_log` is set ('': no log hold) one a second answers HELD."""
        unclaimed = [f"{i.item_id};{i.amount}" for i in items if i.user_id is None]
        grabbers = [
            x for i in items if i.user_id is not None for x in (i.user_id, f"{i.item_id};{i.amount};{i.claimed_at};")
        ]
        return (
            int(
                self.lua.run(
                    "redpacket_load",
                    packet_keys(packet_id),
                    [state, expires_at, hold_until, hold_log, len(unclaimed), *unclaimed, *grabbers],
                )
            )
            == 1
        )

    @staticmethod
    def hold_key(packet_id: int) -> str:
        """The hash a rebuild's log hold lives in (outbox/log_hold.py)."""
        return keys.packet(packet_id)

    def settle(self, claims: list[RedPacketClaimEvent]) -> None:
        """After the claims' DB commit: drop them from the pending hashes (one script per packet, pipelined);
        a claim a rebuild put back into the unclaimed list is taken out of it."""
        by_packet = defaultdict(list)
        for c in claims:
            by_packet[c.packet_id].append(c)
        if not by_packet:
            return
        pipe = self.lua.pipeline()
        for packet_id, group in by_packet.items():
            self.lua.run(
                "redpacket_settle",
                [keys.packet_unclaimed(packet_id), keys.packet_grabbers(packet_id), keys.packet_pending(packet_id)],
                [x for c in group for x in (c.item_id, c.user_id, c.amount, c.ts)],
                client=pipe,
            )
        pipe.execute()

    def expire(self, packet_id: int, now_ms: int) -> ExpireReply:
        """Close the packet to grabs if it expired by now_ms."""
        return ExpireReply.parse(
            self.lua.run("redpacket_expire", [keys.packet(packet_id), keys.packet_pending(packet_id)], [now_ms])
        )

    # raw reads and writes -----------------------------------------------------------------------------
    def mark_open(self, packet_id: int) -> None:
        self.lua.client.hset(keys.packet(packet_id), "state", "OPEN")

    def retire(self, packet_id: int) -> None:
        """The packet's keys leave Redis after FINISHED_KEYS_TTL_S (set once: repeating this does not push it back)."""
        expire_once(
            self.lua.client, [*packet_keys(packet_id), keys.packet_pending(packet_id)], self.finished_keys_ttl_s
        )

    def grabs(self, packet_id: int) -> list[tuple[int, int]]:
        """(user id, amount) of every grab Redis knows, persisted or not, by user id."""
        return sorted(
            (int(user), int(text(value).split(";")[1]))
            for user, value in self.lua.client.hgetall(keys.packet_grabbers(packet_id)).items()
        )

    def pending_claims(self, packet_id: int) -> list[RedPacketClaimEvent]:
        """The grabs whose claim the writer has not persisted yet, as their claim events."""
        claims = []
        for item_id, value in self.lua.client.hgetall(keys.packet_pending(packet_id)).items():
            user_id, amount, ts, grab_id = text(value).split(";")
            claims.append(
                RedPacketClaimEvent(
                    type="redpacket_claim",
                    packet_id=packet_id,
                    item_id=int(item_id),
                    user_id=int(user_id),
                    amount=int(amount),
                    ts=int(ts),
                    grab_id=int(grab_id),
                )
            )
        return claims
