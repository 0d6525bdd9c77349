"""Delay queue on Redis (the seed's Redisson delayed queue, with its O(n) remove fixed).

offer(queue, element, due_at | delay) / remove / contains / size / drain (take what is due) / ack. The element is
the zset member itself (canonical encoding), so a second offer moves its due time and remove is O(log n).
Due elements move atomically to a taken set with a visibility deadline; ack removes them, and an element
not acknowledged in time is taken again: at-least-once delivery, so handlers must be idempotent.
Every delivery has its own receipt (as SQS receipt handles): "<sequence>:<element>". Ack, extend and retry go by
receipt, so the late ack of an earlier delivery (whose lease ran out and went to another consumer) changes nothing.
Deliveries are counted; a failed delivery comes back after an exponential backoff and, once delivered
max_deliveries times, the element moves to the queue's dead letters (SQS's redrive policy), to be listed, replayed
or dropped.
The earliest due time is published (SPUBLISH, sharded pub/sub) on dq:earliest:{queue}; Drainer sleeps until it (or a new earlier one).
delay_offer / delay_remove / delay_take / delay_ack / delay_extend / delay_retry / delay_dead are the typed wrappers
of the scripts of the same names; DelayQueue's public methods raise RedisUnavailable / RedisOutcomeUnknown, never
redis-py's errors.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar, cast

import redis
from redis.client import PubSub

from hotledger import keys
from hotledger.dal.redis_store import (
    Lua,
    RedisUnavailable,
    redis_errors_translated,
    shard_subscription,
    text,
    wait_for_message,
)

log = logging.getLogger(__name__)
NO_TIME = -1
_E = TypeVar("_E")


def canonical(element: object) -> str:
    """Strings stay as they are; anything else becomes compact JSON with sorted keys, so equal elements are
    equal members."""
    return element if isinstance(element, str) else json.dumps(element, sort_keys=True, separators=(",", ":"))


def receipt(sequence: int, element: str) -> str:
    return f"{sequence}:{element}"


def parse_receipt(value: str) -> tuple[str, str]:
    """(sequence, element); ValueError when it is not a receipt."""
    sequence, sep, element = value.partition(":")
    if not sep or not element or not sequence.isdigit() or not sequence.isascii():
        raise ValueError(f"not a delivery receipt: {value!r}")
    return sequence, element


@dataclass(frozen=True)
class Delivery:
    element: str
    due: int  # its due time or, when redelivered, its old visibility deadline
    receipt: str  # acknowledges, extends or retries this delivery only
    deliveries: int  # 1 on the first delivery


@dataclass(frozen=True)
class Taken:
    deliveries: list[Delivery]
    earliest_due: int  # NO_TIME when nothing waits
    earliest_deadline: int  # NO_TIME when nothing is taken
    dead_lettered: int = 0  # elements whose lease ran out after max_deliveries: moved to the dead letters now

    @property
    def elements(self) -> list[tuple[str, int]]:
        return [(d.element, d.due) for d in self.deliveries]

    def next_wake(self) -> int:
        times = [t for t in (self.earliest_due, self.earliest_deadline) if t != NO_TIME]
        return min(times) if times else NO_TIME


@dataclass(frozen=True)
class Offered:
    """delay_offer.lua's answer."""

    new: bool  # False: the element was there and its due time moved
    earliest_due: int
    full: bool = False  # refused: the queue holds its bound (nothing changed)


class QueueFull(Exception):
    """A new element for a queue holding its bound (waiting + taken); nothing was changed."""


def _ms(score: bytes | str | float) -> int:
    """A zset score as the script returns it (text, maybe in exponent form) -> epoch ms."""
    return int(float(score))


def delay_offer(lua: Lua, queue: str, element: str, due_at_ms: int, bound: int = 0) -> Offered:
    added, earliest = lua.run("delay_offer", keys.delay_offer_keys(queue), [element, due_at_ms, bound])
    if text(added) == "full":
        return Offered(False, NO_TIME, full=True)
    return Offered(added == 1, _ms(earliest))


def delay_remove(lua: Lua, queue: str, element: str) -> bool:
    """True when the element was there (waiting or taken)."""
    return (
        int(
            lua.run(
                "delay_remove",
                [
                    keys.delay_due(queue),
                    keys.delay_taken(queue),
                    keys.delay_receipts(queue),
                    keys.delay_deliveries(queue),
                    keys.delay_dead(queue),
                ],
                [element],
            )
        )
        == 1
    )


def delay_take(lua: Lua, queue: str, now_ms: int, limit: int, visibility_ms: int, max_deliveries: int = 0) -> Taken:
    elements, earliest, deadline, dead = lua.run(
        "delay_take",
        [
            keys.delay_due(queue),
            keys.delay_taken(queue),
            keys.delay_receipts(queue),
            keys.delay_deliveries(queue),
            keys.delay_seq(queue),
            keys.delay_dead(queue),
        ],
        [now_ms, limit, visibility_ms, max_deliveries],
    )
    taken: list[Delivery] = []
    for i in range(0, len(elements), 4):
        element = text(elements[i])
        taken.append(
            Delivery(element, _ms(elements[i + 1]), receipt(int(elements[i + 2]), element), int(elements[i + 3]))
        )
    return Taken(taken, _ms(earliest), _ms(deadline), int(dead))


def _pairs(receipts: list[str]) -> list[str]:
    args: list[str] = []
    for value in receipts:
        args.extend(parse_receipt(value))
    return args


def delay_ack(lua: Lua, queue: str, receipts: list[str]) -> list[bool]:
    """Per receipt: True when acknowledged, False when stale (a later delivery holds it, or it is not taken)."""
    replies = lua.run(
        "delay_ack",
        [keys.delay_taken(queue), keys.delay_receipts(queue), keys.delay_deliveries(queue)],
        _pairs(receipts),
    )
    return [r == 1 for r in replies]


def delay_extend(lua: Lua, queue: str, receipts: list[str], deadline_ms: int) -> list[bool]:
    replies = lua.run(
        "delay_extend", [keys.delay_taken(queue), keys.delay_receipts(queue)], [deadline_ms, *_pairs(receipts)]
    )
    return [r == 1 for r in replies]


class RetryOutcome(Enum):
    STALE = 0
    RETRY = 1
    DEAD = 2


def delay_retry(
    lua: Lua, queue: str, receipts: list[str], now_ms: int, base_ms: int, cap_ms: int, max_deliveries: int
) -> list[RetryOutcome]:
    replies = lua.run(
        "delay_retry",
        [keys.delay_taken(queue), keys.delay_receipts(queue), keys.delay_deliveries(queue), keys.delay_dead(queue)],
        [now_ms, base_ms, cap_ms, max_deliveries, *_pairs(receipts)],
    )
    return [RetryOutcome(int(r)) for r in replies]


def delay_dead(lua: Lua, queue: str, action: str, elements: list[str], now_ms: int) -> list[bool]:
    """action 'replay' (queued again, due now, count reset) or 'drop'; per element: True when it was a dead letter."""
    replies = lua.run(
        "delay_dead",
        [keys.delay_dead(queue), keys.delay_deliveries(queue), keys.delay_due(queue), keys.delay_channel(queue)],
        [action, now_ms, *elements],
    )
    return [r == 1 for r in replies]


@dataclass(frozen=True)
class DeadLetter:
    element: str
    dead_at: int
    deliveries: int


@dataclass(frozen=True)
class QueueStats:
    waiting: int
    taken: int
    dead: int
    oldest_due_lag_ms: int  # how long the earliest waiting element is overdue (0: none overdue)


@redis_errors_translated
class DelayQueue:
    def __init__(
        self,
        lua: Lua,
        visibility_ms: int = 30_000,
        max_deliveries: int = 0,
        retry_base_ms: int = 1000,
        retry_cap_ms: int = 300_000,
        max_size: int = 0,
    ):
        self.lua, self.redis, self.visibility_ms = lua, lua.client, visibility_ms
        self.max_deliveries, self.retry_base_ms, self.retry_cap_ms = max_deliveries, retry_base_ms, retry_cap_ms
        self.max_size = max_size  # bounds offers made with bounded=True (clients'); 0: none

    def offer(
        self,
        queue: str,
        element: object,
        due_at_ms: int | None = None,
        delay_ms: int | None = None,
        bounded: bool = False,
    ) -> bool:
        """True when new, False when it was there and its due time moved. bounded: a new element for a queue
        holding max_size elements (waiting + taken) raises QueueFull."""
        if (due_at_ms is None) == (delay_ms is None):
            raise ValueError("give exactly one of due_at_ms and delay_ms")
        due = due_at_ms if due_at_ms is not None else int(time.time() * 1000) + (delay_ms or 0)
        offered = delay_offer(self.lua, queue, canonical(element), due, self.max_size if bounded else 0)
        if offered.full:
            raise QueueFull(f"queue {queue!r} holds {self.max_size} elements")
        return offered.new

    def remove(self, queue: str, element: object) -> bool:
        return delay_remove(self.lua, queue, canonical(element))

    def contains(self, queue: str, element: object) -> bool:
        return not self.absent(queue, [element])

    def absent(self, queue: str, elements: Sequence[_E]) -> list[_E]:
        """The elements neither waiting nor taken (one pipelined round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for element in elements:
            pipe.zscore(keys.delay_due(queue), canonical(element))
            pipe.zscore(keys.delay_taken(queue), canonical(element))
        scores = pipe.execute()
        return [
            e
            for e, due, taken in zip(elements, scores[0::2], scores[1::2], strict=True)
            if due is None and taken is None
        ]

    def due_at(self, queue: str, element: object) -> int | None:
        score = self.redis.zscore(keys.delay_due(queue), canonical(element))
        return None if score is None else int(score)

    def size(self, queue: str) -> tuple[int, int]:
        """(waiting, taken and not acknowledged)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(keys.delay_due(queue))
        pipe.zcard(keys.delay_taken(queue))
        waiting, taken = pipe.execute()
        return waiting, taken

    def earliest(self, queue: str) -> int | None:
        head = self.redis.zrange(keys.delay_due(queue), 0, 0, withscores=True)
        return int(head[0][1]) if head else None

    def drain(self, queue: str, now_ms: int, limit: int) -> Taken:
        return delay_take(self.lua, queue, now_ms, limit, self.visibility_ms, self.max_deliveries)

    def ack(self, queue: str, receipts: list[str]) -> list[bool]:
        """By receipt; per receipt True when acknowledged, False when stale (nothing changed)."""
        return delay_ack(self.lua, queue, receipts) if receipts else []

    def extend(self, queue: str, receipts: list[str], visibility_ms: int, now_ms: int | None = None) -> list[bool]:
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        return delay_extend(self.lua, queue, receipts, now + visibility_ms) if receipts else []

    def retry(self, queue: str, receipts: list[str], now_ms: int | None = None) -> list[RetryOutcome]:
        """The deliveries failed: back after an exponential backoff, or dead letters after max_deliveries."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        if not receipts:
            return []
        return delay_retry(self.lua, queue, receipts, now, self.retry_base_ms, self.retry_cap_ms, self.max_deliveries)

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """The oldest first."""
        dead = cast(
            "list[tuple[bytes, float]]", self.redis.zrange(keys.delay_dead(queue), 0, limit - 1, withscores=True)
        )
        if not dead:
            return []
        counts = self.redis.hmget(keys.delay_deliveries(queue), [member for member, _ in dead])
        return [
            DeadLetter(text(member), int(score), int(count or 0))
            for (member, score), count in zip(dead, counts, strict=True)
        ]

    def replay_dead(self, queue: str, elements: list[str], now_ms: int | None = None) -> list[bool]:
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        return delay_dead(self.lua, queue, "replay", elements, now)

    def drop_dead(self, queue: str, elements: list[str]) -> list[bool]:
        return delay_dead(self.lua, queue, "drop", elements, int(time.time() * 1000))

    def stats(self, queue: str, now_ms: int | None = None) -> QueueStats:
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(keys.delay_due(queue))
        pipe.zcard(keys.delay_taken(queue))
        pipe.zcard(keys.delay_dead(queue))
        pipe.zrange(keys.delay_due(queue), 0, 0, withscores=True)
        waiting, taken, dead, head = pipe.execute()
        lag = max(0, now - int(head[0][1])) if head else 0
        return QueueStats(waiting, taken, dead, lag)

    def wake_signals(self, queues: list[str]) -> PubSub:
        """A sharded pub/sub subscription to the queues' earliest-due channels (an offer publishes an earlier due time)."""
        return shard_subscription(self.redis, [keys.delay_channel(name) for name in queues])


Handler = Callable[[list[str]], None]


@dataclass
class QueueRun:
    """What one drainer saw of one queue (the delay drainer reports it as metrics per queue)."""

    handled: int = 0
    redeliveries: int = 0  # deliveries after the first (a lease ran out, or a handler failed)
    failures: int = 0  # deliveries whose handler raised (they come back after a backoff)
    dead_lettered: int = 0


class Drainer:
    """Hands due elements to their queue's handler (a batch at a time), acknowledging by receipt after it returned.
    Starts with whatever is overdue (crash recovery), then sleeps until the earliest due time, woken early
    when an offer publishes an earlier one.
    A handler that raises does not stop the run: the batch is handed over again one element at a time, so only the
    failing elements fail; those come back after an exponential backoff, and after max_deliveries they move to the
    dead letters. Then the drainer goes on to the other queues (one bad element cannot starve them)."""

    def __init__(self, queue: DelayQueue, handlers: dict[str, Handler], batch: int = 500, idle_wait_ms: int = 1000):
        self.queue, self.handlers, self.batch, self.idle_wait_ms = queue, handlers, batch, idle_wait_ms
        self.handled = 0
        self.runs: dict[str, QueueRun] = {name: QueueRun() for name in handlers}

    def drain_due(self, now_ms: int | None = None) -> int:
        """Everything due now, every queue; returns the next time something is due (NO_TIME: nothing)."""
        wake = NO_TIME
        for name, handler in self.handlers.items():
            seen = self.runs.setdefault(name, QueueRun())
            failed_before = seen.failures
            while True:
                taken = self.queue.drain(name, now_ms or int(time.time() * 1000), self.batch)
                seen.dead_lettered += taken.dead_lettered
                if taken.deliveries:
                    seen.redeliveries += sum(1 for d in taken.deliveries if d.deliveries > 1)
                    self._hand_over(name, handler, taken.deliveries, seen)
                if len(taken.deliveries) + taken.dead_lettered < self.batch:
                    break
            nxt = taken.next_wake()
            if seen.failures > failed_before:  # a failed delivery comes back after its backoff: wake for it
                retry_at = (now_ms or int(time.time() * 1000)) + self.queue.retry_base_ms
                nxt = retry_at if nxt == NO_TIME else min(nxt, retry_at)
            if nxt != NO_TIME and (wake == NO_TIME or nxt < wake):
                wake = nxt
        return wake

    def _hand_over(self, name: str, handler: Handler, deliveries: list[Delivery], seen: QueueRun) -> None:
        try:
            handler([d.element for d in deliveries])
        except Exception:  # any failure of a handler is this delivery's failure, never the run's
            if len(deliveries) == 1:
                self._failed(name, deliveries, seen)
                return
            log.warning(
                "delay handler failed on a batch; handing it over one element at a time",
                extra={"queue": name, "elements": len(deliveries)},
                exc_info=True,
            )
        else:
            self._acknowledged(name, deliveries, seen)
            return
        for delivery in deliveries:  # handlers are idempotent (at-least-once): the batch's handled ones again
            self._hand_over(name, handler, [delivery], seen)

    def _acknowledged(self, name: str, deliveries: list[Delivery], seen: QueueRun) -> None:
        self.queue.ack(name, [d.receipt for d in deliveries])
        seen.handled += len(deliveries)
        self.handled += len(deliveries)

    def _failed(self, name: str, deliveries: list[Delivery], seen: QueueRun) -> None:
        log.warning(
            "delay handler failed",
            extra={"queue": name, "element": deliveries[0].element, "deliveries": deliveries[0].deliveries},
            exc_info=True,
        )
        outcomes = self.queue.retry(name, [d.receipt for d in deliveries])
        seen.failures += len(deliveries)
        for delivery, outcome in zip(deliveries, outcomes, strict=True):
            if outcome is RetryOutcome.DEAD:
                seen.dead_lettered += 1
                log.error(
                    "delay element dead-lettered",
                    extra={"queue": name, "element": delivery.element, "deliveries": delivery.deliveries},
                )

    def run(self, keep_going: Callable[[], bool]) -> int:
        pubsub = self.queue.wake_signals(list(self.handlers))
        try:
            while keep_going():
                try:
                    wake = self.drain_due()
                except (RedisUnavailable, redis.RedisError):  # a handler's store may still raise redis-py's
                    log.exception("delay queue unreachable; retrying")
                    time.sleep(0.5)
                    continue
                now = int(time.time() * 1000)
                sleep_ms = self.idle_wait_ms if wake == NO_TIME else min(max(wake - now, 0), self.idle_wait_ms)
                if sleep_ms > 0:
                    wait_for_message(pubsub, sleep_ms / 1000)  # an offer may publish an earlier due time
        finally:
            pubsub.close()
        return self.handled
