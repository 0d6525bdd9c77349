"""Delay queue on Redis (the seed's Redisson delayed queue, with its O(n) remove fixed).

offer(queue, element, due_at | delay) / remove / contains / size / drain (take what is due) / ack. The element is
the zset member itself (canonical encoding), so a second offer moves its due time and remove is O(log n).
Due elements move atomically to a taken set with a visibility deadline; ack removes them, and an element
not acknowledged in time is taken again: at-least-once delivery, so handlers must be idempotent.
The earliest due time is published on dq:earliest:{queue}; Drainer sleeps until it (or a new earlier one).
delay_offer / delay_remove / delay_take are the typed wrappers of the scripts of the same names; DelayQueue's
public methods raise RedisUnavailable / RedisOutcomeUnknown, never redis-py's errors.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from hotledger.dal.redis_store import Lua, RedisUnavailable, redis_errors_translated, text, wait_for_message

log = logging.getLogger(__name__)
NO_TIME = -1


def canonical(element) -> str:
    """Strings stay as they are; anything else becomes compact JSON with sorted keys, so equal elements are
    equal members."""
    return element if isinstance(element, str) else json.dumps(element, sort_keys=True, separators=(",", ":"))


def due_key(queue: str) -> str:
    return f"dq:due:{{{queue}}}"


def taken_key(queue: str) -> str:
    return f"dq:taken:{{{queue}}}"


def channel(queue: str) -> str:
    return f"dq:earliest:{{{queue}}}"


@dataclass(frozen=True)
class Taken:
    elements: list[tuple[str, int]]  # (element, due or, when redelivered, its old visibility deadline)
    earliest_due: int  # NO_TIME when nothing waits
    earliest_deadline: int  # NO_TIME when nothing is taken

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


def _ms(score) -> int:
    """A zset score as the script returns it (text, maybe in exponent form) -> epoch ms."""
    return int(float(score))


def delay_offer(lua: Lua, queue: str, element: str, due_at_ms: int, bound: int = 0) -> Offered:
    added, earliest = lua.run("delay_offer", [due_key(queue), channel(queue), taken_key(queue)], [element, due_at_ms, bound])
    if text(added) == "full":
        return Offered(False, NO_TIME, full=True)
    return Offered(added == 1, _ms(earliest))


def delay_remove(lua: Lua, queue: str, element: str) -> bool:
    """True when the element was there (waiting or taken)."""
    return lua.run("delay_remove", [due_key(queue), taken_key(queue)], [element]) == 1


def delay_take(lua: Lua, queue: str, now_ms: int, limit: int, visibility_ms: int) -> Taken:
    elements, earliest, deadline = lua.run("delay_take", [due_key(queue), taken_key(queue)], [now_ms, limit, visibility_ms])
    pairs = [(text(elements[i]), _ms(elements[i + 1])) for i in range(0, len(elements), 2)]
    return Taken(pairs, _ms(earliest), _ms(deadline))


@redis_errors_translated
class DelayQueue:
    def __init__(self, lua: Lua, visibility_ms: int = 30_000, max_size: int = 0):
        self.lua, self.redis, self.visibility_ms = lua, lua.client, visibility_ms
        self.max_size = max_size  # bounds offers made with bounded=True (clients'); 0: none

    def offer(self, queue: str, element, due_at_ms: int | None = None, delay_ms: int | None = None,
              bounded: bool = False) -> bool:
        """True when new, False when it was there and its due time moved. bounded: a new element for a queue
        holding max_size elements (waiting + taken) raises QueueFull."""
        if (due_at_ms is None) == (delay_ms is None):
            raise ValueError("give exactly one of due_at_ms and delay_ms")
        due = due_at_ms if due_at_ms is not None else int(time.time() * 1000) + delay_ms
        offered = delay_offer(self.lua, queue, canonical(element), due, self.max_size if bounded else 0)
        if offered.full:
            raise QueueFull(f"queue {queue!r} holds {self.max_size} elements")
        return offered.new

    def remove(self, queue: str, element) -> bool:
        return delay_remove(self.lua, queue, canonical(element))

    def contains(self, queue: str, element) -> bool:
        return not self.absent(queue, [element])

    def absent(self, queue: str, elements: list) -> list:
        """The elements neither waiting nor taken (one pipelined round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for element in elements:
            pipe.zscore(due_key(queue), canonical(element))
            pipe.zscore(taken_key(queue), canonical(element))
        scores = pipe.execute()
        return [e for e, due, taken in zip(elements, scores[0::2], scores[1::2]) if due is None and taken is None]

    def due_at(self, queue: str, element) -> int | None:
        score = self.redis.zscore(due_key(queue), canonical(element))
        return None if score is None else int(score)

    def size(self, queue: str) -> tuple[int, int]:
        """(waiting, taken and not acknowledged)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(due_key(queue))
        pipe.zcard(taken_key(queue))
        waiting, taken = pipe.execute()
        return waiting, taken

    def earliest(self, queue: str) -> int | None:
        head = self.redis.zrange(due_key(queue), 0, 0, withscores=True)
        return int(head[0][1]) if head else None

    def drain(self, queue: str, now_ms: int, limit: int) -> Taken:
        return delay_take(self.lua, queue, now_ms, limit, self.visibility_ms)

    def ack(self, queue: str, elements: list[str]) -> None:
        if elements:
            self.redis.zrem(taken_key(queue), *elements)

    def wake_signals(self, queues: list[str]):
        """A pub/sub subscription to the queues' earliest-due channels (an offer publishes an earlier due time)."""
        pubsub = self.redis.pubsub()
        pubsub.subscribe(*(channel(name) for name in queues))
        return pubsub


Handler = Callable[[list[str]], None]


class Drainer:
    """Hands due elements to their queue's handler (a batch at a time), acknowledging after it returned.
    Starts with whatever is overdue (crash recovery), then sleeps until the earliest due time, woken early
    when an offer publishes an earlier one."""

    def __init__(self, queue: DelayQueue, handlers: dict[str, Handler], batch: int = 500, idle_wait_ms: int = 1000):
        self.queue, self.handlers, self.batch, self.idle_wait_ms = queue, handlers, batch, idle_wait_ms
        self.handled = 0

    def drain_due(self, now_ms: int | None = None) -> int:
        """Everything due now, every queue; returns the next time something is due (NO_TIME: nothing)."""
        wake = NO_TIME
        for name, handler in self.handlers.items():
            while True:
                taken = self.queue.drain(name, now_ms or int(time.time() * 1000), self.batch)
                if taken.elements:
                    elements = [element for element, _ in taken.elements]
                    handler(elements)
                    self.queue.ack(name, elements)
                    self.handled += len(elements)
                if len(taken.elements) < self.batch:
                    break
            nxt = taken.next_wake()
            if nxt != NO_TIME and (wake == NO_TIME or nxt < wake):
                wake = nxt
        return wake

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
