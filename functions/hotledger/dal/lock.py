"""Per-account mutual exclusion in Redis: SET NX PX with a random token, released only by its owner."""
from __future__ import annotations

import contextlib
import time
import uuid

import redis

from hotledger import keys


class LockUnavailable(Exception):
    """The lock could not be taken within the wait time, or Redis is unreachable."""


class AccountLock:
    def __init__(self, client: redis.Redis, lease_script, ttl_ms: int, wait_ms: int):
        self._client, self._lease_script = client, lease_script
        self._ttl_ms, self._wait_ms = ttl_ms, wait_ms

    @contextlib.contextmanager
    def hold(self, user_id: int):
        key, token = keys.lock(user_id), uuid.uuid4().hex
        deadline = time.monotonic() + self._wait_ms / 1000
        delay = 0.002
        try:
            while not self._taken(key, token):
                if time.monotonic() >= deadline:
                    raise LockUnavailable(f"account {user_id} is busy")
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        except redis.RedisError as exc:
            raise LockUnavailable(f"lock store unreachable: {exc}") from exc
        try:
            yield
        finally:
            with contextlib.suppress(redis.RedisError):
                self._lease_script(keys=[key], args=[token, "release", 0])

    def _taken(self, key: str, token: str) -> bool:
        # a SET resent after a lost reply finds the key taken by our own token: that is a success
        return bool(self._client.set(key, token, nx=True, px=self._ttl_ms)) or self._client.get(key) == token.encode()
