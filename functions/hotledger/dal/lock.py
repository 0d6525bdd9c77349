"""A Redisson-grade distributed lock on Redis.

- Reentrant: a hash lock:{name} maps the owner (process id + thread id) to its hold count, with a lease
  (lock_acquire.lua). Only the owner can release; the last release deletes the hash and publishes on
  lock:released:{name} (lock_release.lua).
- Waiters do not spin: a waiter queues itself (lock:waiters:{name}, by give-up time), subscribes to the
  channel and sleeps until a release message names it or the holder's lease ends, then tries again, until
  its wait time is used up. A release wakes one waiter, not all of them.
- A watchdog thread renews the lease (every third of it) while the owner holds the lock and forgets the lock
  the moment it is released, even if the release could not reach Redis (Redisson #7272 kept renewing).
  A failed renewal is reported to the owner: Holding.lost is set and on_lost is called (Redisson #4698).
- Every new owner gets a fencing token, one more than the last (lock:fence:{name} never expires). Writers
  that store the token with the data refuse a smaller one, so an owner paused past its lease cannot
  overwrite what the next owner wrote.
- Redis unreachable: LockUnavailable, never "proceed unlocked".
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from hotledger.dal.redis_store import text, wait_for_message

log = logging.getLogger(__name__)


class LockUnavailable(Exception):
    """The lock could not be taken within the wait time, or Redis is unreachable."""


class LockLost(Exception):
    """The lease ran out (renewal failed, or the owner was paused) and someone else may hold the lock."""


class NotLockOwner(Exception):
    """A release by someone who does not hold the lock: refused."""


def lock_key(name: str) -> str:
    return f"lock:{{{name}}}"


def fence_key(name: str) -> str:
    return f"lock:fence:{{{name}}}"


def channel(name: str) -> str:
    return f"lock:released:{{{name}}}"


def waiters_key(name: str) -> str:
    return f"lock:waiters:{{{name}}}"


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

    def __init__(self, renew, lease_ms: int, on_lost: Callable[[Holding], None] | None = None):
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
                    renewed = self._renew(holding) == 1
                except redis.RedisError:
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
    def __init__(self, scripts, lease_ms: int, wait_ms: int, on_lost: Callable[[Holding], None] | None = None):
        self.scripts, self.redis = scripts, scripts.client
        self.lease_ms, self.wait_ms = lease_ms, wait_ms
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
            pubsub = self.redis.pubsub()
            try:
                pubsub.subscribe(channel(name))
                self.commands += 1
                while True:
                    # tried again after subscribing: a release between the first try and the subscription is not missed
                    pttl = self._try(name, owner, gives_up_at)
                    if pttl is None:
                        return self._hold(name, owner)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise LockUnavailable(f"lock {name} is held by another owner")
                    wait_for_message(pubsub, min(remaining, pttl / 1000) if pttl > 0 else remaining, addressed_to=owner)
            finally:
                pubsub.close()
        except redis.RedisError as exc:
            raise LockUnavailable(f"lock store unreachable: {exc}") from exc

    def _try(self, name: str, owner: str, gives_up_at: int) -> int | None:
        """None when acquired (the holding is recorded), else the holder's remaining lease in ms."""
        self.commands += 1
        reply = self.scripts.lock_acquire(keys=[lock_key(name), fence_key(name), waiters_key(name)],
                                           args=[owner, self.lease_ms, gives_up_at])
        if text(reply[0]) == "acquired":
            key = (name, owner)
            if key not in self._holdings or int(reply[2]) == 1:
                self._holdings[key] = Holding(name, owner, int(reply[1]))
            return None
        return int(reply[1])

    def _hold(self, name: str, owner: str) -> Holding:
        holding = self._holdings[(name, owner)]
        self.watchdog.watch(holding)
        return holding

    def release(self, name: str) -> None:
        owner = self.owner()
        try:
            reply = self.scripts.lock_release(keys=[lock_key(name), channel(name), waiters_key(name)],
                                               args=[owner, int(time.time() * 1000)])
        except redis.RedisError:
            # the lease runs out by itself; renewing it would keep a lock nobody releases (Redisson #7272)
            self._drop(name, owner)
            raise
        status = text(reply[0])
        if status == "held":
            return
        self._drop(name, owner)
        if status == "not_owner":
            raise NotLockOwner(f"lock {name} is not held by {owner}")

    def _drop(self, name: str, owner: str) -> None:
        self.watchdog.forget(name, owner)
        self._holdings.pop((name, owner), None)

    def _renew(self, holding: Holding) -> int:
        return self.scripts.lock_renew(keys=[lock_key(holding.name)], args=[holding.owner, self.lease_ms])

    @contextlib.contextmanager
    def hold(self, name: str, wait_ms: int | None = None):
        holding = self.acquire(name, wait_ms)
        try:
            yield holding
        finally:
            with contextlib.suppress(redis.RedisError, NotLockOwner):  # a lost lease shows as holding.lost / the fence
                self.release(name)
