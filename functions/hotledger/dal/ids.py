"""Snowflake-style 63-bit ids: 41 bits of milliseconds since 2025-01-01, 10 bits of worker id,
12 bits of sequence. The worker id is leased in Redis (SET NX with a TTL, renewed while in use), so
two live processes or Lambda containers never share one. The clock running backwards waits instead of
reusing a tick. ids_lease is the typed wrapper of the script of the same name; next_id raises
RedisUnavailable / RedisOutcomeUnknown, never redis-py's errors.

Ids never repeat, also when a lease is lost (Redis lost the key in a failover, or the holder was frozen past
the lease) and another process takes the worker id. Like Chubby's master lease (a new master waits out the
lease its predecessor may still believe in), both sides keep a window of VALID_S:
- a holder issues only within VALID_S after the start of its last successful renewal (measured from before the
  call, on the monotonic and the wall clock both, whichever ends it first: a sandbox frozen with its monotonic
  clock standing still still sees the wall clock move), then renews before issuing again;
- a process that claims a worker id (SET NX succeeded: nobody held it at that moment) issues nothing on it
  before VALID_S + MARGIN_S have passed since the claim answered. Any earlier holder's last successful renewal
  ran in Redis before this claim, so its window is over by then.
MARGIN_S covers the rate and offset differences of the hosts' clocks (ids carry wall-clock milliseconds): ids
stay unique while the hosts' clocks agree within MARGIN_S. The cost is one wait of VALID_S + MARGIN_S per
claim (a cold start, or after a lost lease) and one renewal per VALID_S while ids are issued.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from enum import Enum

from hotledger import keys
from hotledger.dal.redis_store import Lua, RedisUnavailable, redis_errors_translated

EPOCH_MS = 1_735_689_600_000
WORKER_BITS, SEQUENCE_BITS = 10, 12
MAX_WORKERS, MAX_SEQUENCE = 1 << WORKER_BITS, (1 << SEQUENCE_BITS) - 1
LEASE_MS = 10 * 60 * 1000
MAX_LATE_RENEWALS = 3  # renewals in a row answered after their window before a request gets 503
VALID_S = 0.5  # a successful renewal lets the holder issue for this long, from before the renewal call
MARGIN_S = 0.2  # a fresh claim waits VALID_S + MARGIN_S before its first id


class NoWorkerId(Exception):
    """All worker ids are leased."""


class LeaseAction(Enum):
    RELEASE = "release"
    RENEW = "renew"


def ids_lease(lua: Lua, key: str, token: str, action: LeaseAction, lease_ms: int = 0) -> bool:
    """Release or renew (for lease_ms) a lease key only while it holds our token; False when it is gone or
    someone else's."""
    return int(lua.run("ids_lease", [key], [token, action.value, lease_ms])) == 1


@redis_errors_translated
class IdGenerator:
    def __init__(self, lua: Lua, lease_ms: int = LEASE_MS):
        self._lua, self._client, self._lease_ms = lua, lua.client, lease_ms
        self._token = f"{os.getpid()}-{uuid.uuid4().hex}"
        self._mutex = threading.Lock()
        self._worker: int | None = None
        self._valid_until = (0.0, 0.0)  # (monotonic, wall): issue only before both
        self._last_ms, self._sequence = 0, 0

    def _valid(self) -> bool:
        monotonic_until, wall_until = self._valid_until
        return time.monotonic() < monotonic_until and time.time() < wall_until

    def _lease(self) -> int:
        """The worker id to issue on now: renewed (or claimed, then waited out and renewed) if need be."""
        late_renewals = 0
        while not (self._worker is not None and self._valid()):
            started = time.monotonic(), time.time()  # before the call: the window never outlasts the lease's
            if self._worker is not None and ids_lease(
                self._lua, self._key(self._worker), self._token, LeaseAction.RENEW, self._lease_ms
            ):
                self._valid_until = (started[0] + VALID_S, started[1] + VALID_S)
                if not self._valid():  # answered after its own window: the lease is ours, this window gone; again
                    late_renewals += 1
                    if late_renewals == MAX_LATE_RENEWALS:
                        raise RedisUnavailable("the id lease renewal answered too late to issue on it; retry")
                continue
            # lost (or never held): claim a free worker id and wait out whoever held it last
            self._worker, self._valid_until = None, (0.0, 0.0)
            worker = self._claim()
            time.sleep(VALID_S + MARGIN_S)
            self._worker = worker  # the loop renews it: the window starts after the wait
        return self._worker

    def _claim(self) -> int:
        start = self._client.incr(keys.IDGEN_WORKER_PREFIX + "next")
        for offset in range(MAX_WORKERS):
            worker = (start + offset) % MAX_WORKERS
            if self._client.set(self._key(worker), self._token, nx=True, px=self._lease_ms):
                return worker
        raise NoWorkerId("all 1024 worker ids are leased")

    @staticmethod
    def _key(worker: int) -> str:
        return keys.IDGEN_WORKER_PREFIX + str(worker)

    def next_id(self) -> int:
        with self._mutex:
            while True:
                worker = self._lease()
                now_ms = self._tick()
                if self._valid():  # the window still held when the tick was taken (a tick may wait)
                    return (
                        ((now_ms - EPOCH_MS) << (WORKER_BITS + SEQUENCE_BITS))
                        | (worker << SEQUENCE_BITS)
                        | self._sequence
                    )

    def _tick(self) -> int:
        """The millisecond of the next id, with self._sequence set for it."""
        now_ms = int(time.time() * 1000)
        while now_ms < self._last_ms:  # clock stepped back: wait it out
            time.sleep((self._last_ms - now_ms) / 1000)
            now_ms = int(time.time() * 1000)
        if now_ms == self._last_ms:
            self._sequence = (self._sequence + 1) & MAX_SEQUENCE
            if self._sequence == 0:
                while now_ms <= self._last_ms:
                    now_ms = int(time.time() * 1000)
        else:
            self._sequence = 0
        self._last_ms = now_ms
        return now_ms
