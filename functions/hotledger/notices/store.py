"""Notices' storage: the t_payment_order table (every statement its own transaction: each method is a whole
operation), the app inbox and the journeys on Redis, and the typed wrappers of inbox_post.lua, inbox_pull.lua
and journey_done.lua. Redis methods raise RedisUnavailable / RedisOutcomeUnknown, never redis-py's errors."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hotledger import errors, keys
from hotledger.dal import db
from hotledger.dal.lock import Holding
from hotledger.dal.redis_store import Lua, redis_errors_translated, text
from hotledger.dal.script_reply import ScriptReply


class PaymentOrderState(Enum):
    OPEN = "OPEN"
    PAID = "PAID"
    CLOSED = "CLOSED"


@dataclass(frozen=True)
class PaymentOrder:
    id: int
    user_id: int
    amount: int  # minor units
    state: PaymentOrderState
    close_at: int  # epoch ms
    reminder_due_at: int | None = None  # while the close reminder is queued
    reminded: bool = False  # its close reminder was written to the inbox
    pay_started_at: int | None = None  # epoch ms: a pay began its charge (cleared when the charge was refused)

    def awaits_reminder(self, now_ms: int) -> bool:
        return self.state is PaymentOrderState.OPEN and not self.reminded and now_ms < self.close_at


class PaymentOrderStore:
    def insert(self, payment_order: PaymentOrder) -> None:
        """A new payment order, its reminder due at its reminder_due_at; nothing when the id is there already (another
        attempt under the same Idempotency-Key inserted it: the one order is both attempts' answer)."""
        db.execute(
            "INSERT INTO t_payment_order (id, user_id, amount, state, close_at, remind_at)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE id = id",
            (
                payment_order.id,
                payment_order.user_id,
                payment_order.amount,
                payment_order.state.value,
                db.to_datetime(payment_order.close_at),
                None if payment_order.reminder_due_at is None else db.to_datetime(payment_order.reminder_due_at),
            ),
        )

    def get_created(self, payment_order_id: int) -> PaymentOrder | None:
        """The payment order as it was created (OPEN, reminder_due_at its reminder's due time), whatever its state now."""
        rows = db.query(
            "SELECT user_id, amount, close_at, remind_at FROM t_payment_order WHERE id = %s", (payment_order_id,)
        )
        if not rows:
            return None
        user_id, amount, close_at, remind_at = rows[0]
        return PaymentOrder(
            payment_order_id, user_id, amount, PaymentOrderState.OPEN, db.to_ms(close_at), db.to_ms(remind_at)
        )

    def get(self, payment_order_id: int) -> PaymentOrder | None:
        found = self.get_many([payment_order_id])
        return found[0] if found else None

    def get_many(self, payment_order_ids: list[int]) -> list[PaymentOrder]:
        """Those of these payment orders that exist (reminder_due_at is the delay queue's: not set here)."""
        if not payment_order_ids:
            return []
        rows = db.query(
            "SELECT id, user_id, amount, state, close_at, reminded_at IS NOT NULL, pay_started_at"
            f" FROM t_payment_order WHERE id IN ({','.join(['%s'] * len(payment_order_ids))})",
            payment_order_ids,
        )
        return [
            PaymentOrder(
                payment_order_id,
                user_id,
                amount,
                PaymentOrderState(state),
                db.to_ms(close_at),
                reminded=bool(reminded),
                pay_started_at=None if started is None else db.to_ms(started),
            )
            for payment_order_id, user_id, amount, state, close_at, reminded, started in rows
        ]

    def claim(self, payment_order_id: int, held: Holding, paying_at: int | None = None) -> None:
        """Take the row for the holder of the payment order's lock under its fencing token (refused with FencedOut
        when a newer owner took it, or another holder with the same token: handed out twice by a Redis that lost the
        last acquisition), as t_account.fence does for accounts. paying_at: a pay is about to charge."""
        with db.transaction() as cur:
            cur.execute("SELECT fence, fence_owner FROM t_payment_order WHERE id = %s FOR UPDATE", (payment_order_id,))
            seen = cur.fetchone()
            if seen is not None and (
                seen[0] > held.fence or (seen[0] == held.fence and seen[1] not in (None, held.owner))
            ):
                raise errors.FencedOut(
                    "this request's hold on the order lock ran out and a newer one took the order; "
                    "nothing was changed, retry"
                )
            cur.execute(
                "UPDATE t_payment_order SET fence = %s, fence_owner = %s,"
                " pay_started_at = COALESCE(%s, pay_started_at) WHERE id = %s",
                (held.fence, held.owner, None if paying_at is None else db.to_datetime(paying_at), payment_order_id),
            )

    def pay_refused(self, payment_order_id: int, held: Holding) -> None:
        """The pay's charge was refused (nothing charged): a close need not wait for it."""
        db.execute(
            "UPDATE t_payment_order SET pay_started_at = NULL WHERE id = %s AND fence = %s AND fence_owner = %s",
            (payment_order_id, held.fence, held.owner),
        )

    def mark_paid(self, payment_order_id: int, deduct_entry_id: int) -> bool:
        """OPEN -> PAID by the ledger deduct entry that paid it; False when it was not OPEN. Not fenced: a charge
        made for the payment order makes it PAID whoever settles it."""
        return (
            db.execute(
                "UPDATE t_payment_order SET state = 'PAID', deduct_order_id = %s WHERE id = %s AND state = 'OPEN'",
                (deduct_entry_id, payment_order_id),
            )
            == 1
        )

    def mark_closed(self, payment_order_id: int, held: Holding) -> bool:
        """OPEN -> CLOSED by the lock holder that took the row with its fencing token; False when it was not OPEN
        or another holder took it."""
        return (
            db.execute(
                "UPDATE t_payment_order SET state = 'CLOSED' WHERE id = %s AND state = 'OPEN' AND fence = %s"
                " AND fence_owner = %s",
                (payment_order_id, held.fence, held.owner),
            )
            == 1
        )

    def mark_refunded(self, payment_order_id: int, refund_entry_id: int) -> None:
        """The charge made after the close was given back by this ledger recharge."""
        db.execute("UPDATE t_payment_order SET refund_order_id = %s WHERE id = %s", (refund_entry_id, payment_order_id))

    def open_past_close(self, now_ms: int, limit: int) -> list[int]:
        """Open payment orders whose close time has come, earliest first."""
        rows = db.query(
            "SELECT id FROM t_payment_order WHERE state = 'OPEN' AND close_at <= %s ORDER BY close_at LIMIT %s",
            (db.to_datetime(now_ms), limit),
        )
        return [payment_order_id for (payment_order_id,) in rows]

    def mark_reminded(self, payment_order_ids: list[int], now_ms: int) -> None:
        db.execute(
            f"UPDATE t_payment_order SET reminded_at = %s WHERE id IN ({','.join(['%s'] * len(payment_order_ids))})",
            [db.to_datetime(now_ms), *payment_order_ids],
        )

    def unreminded(self, now_ms: int, after_id: int, limit: int) -> list[tuple[int, int]]:
        """(id, reminder due time) of the open payment orders not reminded yet and not past their close time,
        by id after after_id (a page)."""
        rows = db.query(
            "SELECT id, COALESCE(remind_at, create_time) FROM t_payment_order WHERE state = 'OPEN'"
            " AND reminded_at IS NULL AND close_at > %s AND id > %s ORDER BY id LIMIT %s",
            (db.to_datetime(now_ms), after_id, limit),
        )
        return [(payment_order_id, db.to_ms(remind_at)) for payment_order_id, remind_at in rows]


class PostStatus(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"  # this (biz_type, outer_biz_id) was posted before: nothing written


@dataclass(frozen=True)
class PostReply(ScriptReply):
    """inbox_post.lua's answer: the message id written now (NEW) or the one written first (DUPLICATE)."""

    status: PostStatus
    message_id: str

    FIELDS = {PostStatus.NEW: ("message_id",), PostStatus.DUPLICATE: ("message_id",)}


@redis_errors_translated
class InboxStore:
    """Per account: a zset index of message ids by creation time, one string per message (its JSON body,
    expiring with the TTL) and one (biz_type, outer_biz_id) record per business event."""

    def __init__(self, lua: Lua):
        self.lua, self.redis = lua, lua.client

    def post(
        self,
        account: int,
        biz_type: str,
        outer_biz_id: str,
        message_id: str,
        created_ms: int,
        body: str,
        ttl_s: int,
        max_messages: int,
    ) -> PostReply:
        return PostReply.parse(
            self.lua.run(
                "inbox_post",
                [
                    keys.inbox_index(account),
                    keys.inbox_message(account, message_id),
                    keys.inbox_biz(account, biz_type, outer_biz_id),
                ],
                [message_id, created_ms, body, ttl_s, max_messages],
            )
        )

    def pull(self, account: int, after: str | None, limit: int) -> list[str]:
        """The bodies of the messages after the message id `after` (from the start when None or no longer
        indexed), oldest first; messages expired meanwhile are left out."""
        ids = [text(i) for i in self.lua.run("inbox_pull", [keys.inbox_index(account)], [after or "", limit])]
        if not ids:
            return []
        bodies = self.redis.mget([keys.inbox_message(account, i) for i in ids])
        return [text(body) for body in bodies if body is not None]


@redis_errors_translated
class JourneyStore:
    """Per biz: a zset of account -> start time (epoch ms)."""

    def __init__(self, lua: Lua):
        self.lua, self.redis = lua, lua.client

    def start(self, biz: str, account: int, now_ms: int) -> int:
        """Records the start unless one is recorded (NX); returns the start time in force."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.journeys(biz), {str(account): now_ms}, nx=True)
        pipe.zscore(keys.journeys(biz), str(account))
        return int(pipe.execute()[1])

    def finish(self, biz: str, account: int) -> bool:
        return self.redis.zrem(keys.journeys(biz), str(account)) == 1

    def started_before(self, biz: str, before_ms: int, limit: int) -> list[tuple[int, int]]:
        """(account, start time) of the journeys started at or before before_ms, oldest first."""
        stale = self.redis.zrangebyscore(keys.journeys(biz), "-inf", before_ms, start=0, num=limit, withscores=True)
        # withscores=True answers (member, score) pairs: redis-py's stub does not narrow its reply type on it
        pairs: list[tuple[bytes | str, float]] = stale  # type: ignore[assignment]
        return [(int(text(account)), int(started)) for account, started in pairs]

    def done(self, biz: str, account: int, started: int) -> bool:
        """Drop a reminded journey unless it started again meanwhile (journey_done.lua); True when dropped."""
        return int(self.lua.run("journey_done", [keys.journeys(biz)], [account, started])) == 1
