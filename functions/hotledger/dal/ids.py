"""Snowflake-style 63-bit ids: 41 bits of milliseconds since 2025-01-01, 10 bits of worker id,
12 bits of sequence. The worker id is leased in Redis (SET NX with a TTL, renewed while in use), so
two live processes or Lambda containers never share one. The lease is re-checked at most once a
second, so a container frozen past its lease, or a Redis that lost the lease keys, makes the holder
re-claim (or replace) its id before issuing more. The clock running backwards waits instead of
reusing a tick. The writer still compares content on id clashes and dead-letters a clash.
ids_lease is the typed wrapper of the script of the same name; next_id raises RedisUnavailable /
RedisOutcomeUnknown, never redis-py's errors."""
from __future__ import annotations

import os
import threading
import time
import uuid
from enum import Enum

from hotledger import keys
from hotledger.dal.redis_store import Lua, redis_errors_translated

EPOCH_MS = 1_735_689_600_000
WORKER_BITS, SEQUENCE_BITS = 10, 12
MAX_WORKERS, MAX_SEQUENCE = 1 << WORKER_BITS, (1 << SEQUENCE_BITS) - 1
LEASE_MS = 10 * 60 * 1000
CHECK_EVERY_S = 1.0


class NoWorkerId(Exception):
    """All worker ids are leased."""


class LeaseAction(Enum):
    RELEASE = "release"
    RENEW = "renew"


def ids_lease(lua: Lua, key: str, token: str, action: LeaseAction, lease_ms: int = 0) -> bool:
    """Release or renew (for lease_ms) a lease key only while it holds our token; False when it is gone or
    someone else's."""
    return lua.run("ids_lease", [key], [token, action.value, lease_ms]) == 1


@redis_errors_translated
class IdGenerator:
    def __init__(self, lua: Lua, lease_ms: int = LEASE_MS):
        self._lua, self._client, self._lease_ms = lua, lua.client, lease_ms
        self._token = f"{os.getpid()}-{uuid.uuid4().hex}"
        self._mutex = threading.Lock()
        self._worker: int | None = None
        self._checked_until = 0.0
        self._last_ms, self._sequence = 0, 0

    def _lease(self) -> int:
        now = time.monotonic()
        if self._worker is not None and now < self._checked_until:
            return self._worker
        if self._worker is not None and (
            ids_lease(self._lua, self._key(self._worker), self._token, LeaseAction.RENEW, self._lease_ms)
            or self._client.set(self._key(self._worker), self._token, nx=True, px=self._lease_ms)
        ):
            self._checked_until = now + CHECK_EVERY_S
            return self._worker
        start = self._client.incr(keys.IDGEN_WORKER_PREFIX + "next")
        for offset in range(MAX_WORKERS):
            worker = (start + offset) % MAX_WORKERS
            if self._client.set(self._key(worker), self._token, nx=True, px=self._lease_ms):
                self._worker, self._checked_until = worker, now + CHECK_EVERY_S
                return worker
        raise NoWorkerId("all 1024 worker ids are leased")

    @staticmethod
    def _key(worker: int) -> str:
        return keys.IDGEN_WORKER_PREFIX + str(worker)

    def next_id(self) -> int:
        with self._mutex:
            worker = self._lease()
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
            return ((now_ms - EPOCH_MS) << (WORKER_BITS + SEQUENCE_BITS)) | (worker << SEQUENCE_BITS) | self._sequence
