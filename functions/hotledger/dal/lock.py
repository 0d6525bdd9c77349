"""A Redisson-grade distributed lock on Redis.

- Reentrant: a hash lock:{name} maps the owner (process id + thread id) to its hold count, with a lease
  (lock_acquire.lua). Only the owner can release; the last release deletes the hash and publishes on
  lock:released:{name} (lock_release.lua).
- Waiters do not spin: a waiter queues itself (lock:waiters:{name}, by give-up time), subscribes to the
  channel and sleeps until a release message names it or the holder's lease ends, then tries again, until
  its wait time is used up. A release wakes one waiter, not all of them: the first live one. A waiter stays in
  line only for a liveness window (`waiter_liveness_ms`) and re-queues itself by trying again at least every
  half window, so a waiter that died (SIGKILL, a frozen Lambda) drops out within the window and a release
  never spends its one wake-up message on it (the live ones would sleep on until the holder's lease ended).
- A watchdog thread renews the lease (every third of it) while the owner holds the lock and forgets the lock
  the moment it is released, even if the release could not reach Redis (Redisson #7272 kept renewing).
  A failed renewal is reported to the owner: Holding.lost is set and on_lost is called (Redisson #4698).
- Every new owner gets a fencing token, one more than the last (lock:fence:{name} never expires). Writers
  that store the token with the data refuse a smaller one, so an owner paused past its lease cannot
  overwrite what the next owner wrote. Tokens only grow, even across a Redis loss: a missing counter is seeded
  from Redis' clock (1000 per ms, a hybrid logical clock), above every token handed out before the loss.
- Redis unreachable: LockUnavailable, never "proceed unlocked" (a release that cannot reach Redis raises
  RedisUnavailable; hold() lets the lease run out instead).
lock_acquire / lock_release / lock_renew are the typed wrappers of the scripts of the same names.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

import redis

from hotledger import keys
from hotledger.dal.redis_store import Lua, RedisUnavailable, reply_fields, shard_subscription, wait_for_message
from hotledger.dal.script_reply import ScriptReply

log = logging.getLogger(__name__)


class LockUnavailable(Exception):
    """The lock could not be taken within the wait time, or Redis is unreachable."""


class LockLost(Exception):
    """The lease ran out (renewal failed, or the owner was paused) and someone else may hold the lock."""


class NotLockOwner(Exception):
    """A release by someone who does not hold the lock: refused."""


class AcquireStatus(Enum):
    ACQUIRED = "acquired"
    HELD = "held"


@dataclass(frozen=True)
class AcquireReply(ScriptReply):
    """lock_acquire.lua's answer: ACQUIRED with the owner's fencing token and hold count (1: a new owner), or
    HELD by another owner for `pttl` more ms."""

    status: AcquireStatus
    fence: int = 0
    count: int = 0
    pttl: int = 0

    FIELDS = {AcquireStatus.ACQUIRED: ("fence", "count"), AcquireStatus.HELD: ("pttl",)}


class ReleaseStatus(Enum):
    NOT_OWNER = "not_owner"
    HELD = "held"  # released once, still held (re-entered)
    RELEASED = "released"


def lock_acquire(lua: Lua, name: str, owner: str, lease_ms: int, queued_until: int) -> AcquireReply:
    """queued_until: until when the caller counts as waiting (epoch ms), 0 when it will not wait (not queued)."""
    return AcquireReply.parse(
        lua.run(
            "lock_acquire",
            [keys.lock(name), keys.lock_fence(name), keys.lock_waiters(name)],
            [owner, lease_ms, queued_until],
        )
    )


def lock_release(lua: Lua, name: str, owner: str, now_ms: int) -> ReleaseStatus:
    return ReleaseStatus(
        reply_fields(
            lua.run(
                "lock_release", [keys.lock(name), keys.lock_channel(name), keys.lock_waiters(name)], [owner, now_ms]
            )
        )[0]
    )


def lock_renew(lua: Lua, name: str, owner: str, lease_ms: int) -> bool:
    """False when the owner no longer holds the lock (lease expired, taken over)."""
    return int(lua.run("lock_renew", [keys.lock(name)], [owner, lease_ms])) == 1


@dataclass
class Holding:
    name: str
    owner: str
    fence: int
    lost: threading.Event = field(default_factory=threading.Event)

    def ensure_held(self) -> None:
        if self.lost.is_set():
            raise LockLost(f"the lease of lock {self.name} ran out")


class Watchdog:
    """Renews the leases of the locks this process holds; one daemon thread, started on first use."""

    def __init__(
        self, renew: Callable[[Holding], bool], lease_ms: int, on_lost: Callable[[Holding], None] | None = None
    ):
        self._renew, self._lease_ms, self._on_lost = renew, lease_ms, on_lost
        self._held: dict[tuple[str, str], Holding] = {}
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, holding: Holding) -> None:
        with self._guard:
            self._held[(holding.name, holding.owner)] = holding
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lock-watchdog", daemon=True)
                self._thread.start()

    def forget(self, name: str, owner: str) -> None:
        with self._guard:
            self._held.pop((name, owner), None)

    def watching(self) -> list[str]:
        with self._guard:
            return [name for name, _ in self._held]

    def _run(self) -> None:
        while True:
            time.sleep(self._lease_ms / 3000)
            with self._guard:
                held = list(self._held.values())
            for holding in held:
                try:
                    renewed = self._renew(holding)
                except RedisUnavailable:
                    renewed = False
                if not renewed:
                    self._lose(holding)

    def _lose(self, holding: Holding) -> None:
        self.forget(holding.name, holding.owner)
        log.error("lock lease lost", extra={"lock": holding.name, "fence": holding.fence})
        try:
            if self._on_lost:
                self._on_lost(holding)
        finally:  # set last: whoever waits on it sees the report done
            holding.lost.set()


class DistributedLock:
    def __init__(
        self,
        lua: Lua,
        lease_ms: int,
        wait_ms: int,
        on_lost: Callable[[Holding], None] | None = None,
        waiter_liveness_ms: int = 3000,
    ):
        self.lua, self.redis = lua, lua.client
        self.lease_ms, self.wait_ms, self.waiter_liveness_ms = lease_ms, wait_ms, waiter_liveness_ms
        self._process = uuid.uuid4().hex[:12]
        self._holdings: dict[tuple[str, str], Holding] = {}
        self.watchdog = Watchdog(self._renew, lease_ms, on_lost)
        self.commands = 0  # Redis commands spent acquiring (the benchmark reports it)

    def owner(self) -> str:
        return f"{self._process}:{threading.get_ident()}"

    def acquire(self, name: str, wait_ms: int | None = None) -> Holding:
        wait_ms = self.wait_ms if wait_ms is None else wait_ms
        owner, deadline = self.owner(), time.monotonic() + wait_ms / 1000
        gives_up_at = int(time.time() * 1000) + wait_ms if wait_ms > 0 else 0
        try:
            reply = self._try(name, owner, gives_up_at)
            if reply is None:
                return self._hold(name, owner)
            pubsub = shard_subscription(self.redis, [keys.lock_channel(name)])
            try:
                self.commands += 1
                while True:
                    # tried again after subscribing: a release between the first try and the subscription is not missed
                    pttl = self._try(name, owner, gives_up_at)
                    if pttl is None:
                        return self._hold(name, owner)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise LockUnavailable(f"lock {name} is held by another owner")
                    # back within half the liveness window at the latest: the next try keeps this waiter in line
                    sleep_s = min(remaining, self.waiter_liveness_ms / 2000)
                    wait_for_message(pubsub, min(sleep_s, pttl / 1000) if pttl > 0 else sleep_s, addressed_to=owner)
            finally:
                pubsub.close()
        except (RedisUnavailable, redis.RedisError) as exc:  # the scripts' errors come translated, pub/sub's do not
            raise LockUnavailable(f"lock store unreachable: {exc}") from exc

    def _try(self, name: str, owner: str, gives_up_at: int) -> int | None:
        """None when acquired (the holding is recorded), else the holder's remaining lease in ms."""
        self.commands += 1
        queued_until = min(gives_up_at, int(time.time() * 1000) + self.waiter_liveness_ms) if gives_up_at else 0
        reply = lock_acquire(self.lua, name, owner, self.lease_ms, queued_until)
        if reply.status is AcquireStatus.ACQUIRED:
            key = (name, owner)
            if key not in self._holdings or reply.count == 1:
                self._holdings[key] = Holding(name, owner, reply.fence)
            return None
        return reply.pttl

    def _hold(self, name: str, owner: str) -> Holding:
        holding = self._holdings[(name, owner)]
        self.watchdog.watch(holding)
        return holding

    def release(self, name: str) -> None:
        owner = self.owner()
        try:
            status = lock_release(self.lua, name, owner, int(time.time() * 1000))
        except RedisUnavailable:
            # the lease runs out by itself; renewing it would keep a lock nobody releases (Redisson #7272)
            self._drop(name, owner)
            raise
        if status is ReleaseStatus.HELD:
            return
        self._drop(name, owner)
        if status is ReleaseStatus.NOT_OWNER:
            raise NotLockOwner(f"lock {name} is not held by {owner}")

    def _drop(self, name: str, owner: str) -> None:
        self.watchdog.forget(name, owner)
        self._holdings.pop((name, owner), None)

    def _renew(self, holding: Holding) -> bool:
        return lock_renew(self.lua, holding.name, holding.owner, self.lease_ms)

    @contextlib.contextmanager
    def hold(self, name: str, wait_ms: int | None = None) -> Iterator[Holding]:
        holding = self.acquire(name, wait_ms)
        try:
            yield holding
        finally:
            with contextlib.suppress(RedisUnavailable, NotLockOwner):  # a lost lease shows as holding.lost / the fence
                self.release(name)
