"""Idempotency-Keys of the routes that move money or stock outside the ledger's own charges (red packets, grabs,
voucher orders, payment orders): one Redis record per (scope, key), Stripe's model.

- The record is bound to the first request's fingerprint (route and body): another request with the key is a
  conflict (409 IDEMPOTENCY_KEY_REUSED).
- The attempt that opened it holds it for a lease (longer than the API function's timeout); another attempt in that
  time is told the first one is in flight (409 IDEMPOTENCY_IN_PROGRESS). An attempt that died holding it loses it
  when the lease runs out, and the next attempt runs the request again.
- The first definitive answer (status and body, a business refusal included) is kept and replayed for the record's
  life (24 h, Stripe's lifetime); an attempt that changed nothing (a transient 503) gives the key back.

The scripts are layers/lua/idem_begin.lua, idem_finish.lua and idem_abandon.lua.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal.redis_store import Lua, reply_fields

DAY_S = 24 * 3600
LEASE_MS = 60_000  # above the API function's 30 s timeout: a live attempt never loses its key


class BeginStatus(Enum):
    NEW = "new"
    REPLAY = "replay"
    CONFLICT = "conflict"
    RUNNING = "running"


@dataclass(frozen=True)
class Begun:
    """idem_begin.lua's answer: NEW (the caller runs the request and holds the record with `token`), REPLAY (the
    key's answer: `status` and `body`), CONFLICT or RUNNING."""

    status: BeginStatus
    token: str = ""
    answer_status: int | None = None
    body: str | None = None


def record_key(scope: str, idem_key: str) -> str:
    return f"idem:{keys.tag(scope)}:{idem_key}"


class Idempotency:
    def __init__(self, lua: Lua, ttl_s: int = DAY_S, lease_ms: int = LEASE_MS):
        self.lua, self.ttl_s, self.lease_ms = lua, ttl_s, lease_ms

    def begin(self, scope: str, idem_key: str, fingerprint: str) -> Begun:
        token = uuid.uuid4().hex
        reply = reply_fields(self.lua.run("idem_begin", [record_key(scope, idem_key)],
                                          [fingerprint, token, int(time.time() * 1000), self.lease_ms, self.ttl_s]))
        status = BeginStatus(reply[0])
        if status is BeginStatus.REPLAY:
            return Begun(status, answer_status=int(reply[1]), body=reply[2])
        return Begun(status, token=token if status is BeginStatus.NEW else "")

    def finish(self, scope: str, idem_key: str, token: str, status: int, body: str) -> bool:
        """Keep the answer; False when the record is no longer this attempt's."""
        reply = reply_fields(self.lua.run("idem_finish", [record_key(scope, idem_key)], [token, status, body, self.ttl_s]))
        return reply[0] == "done"

    def abandon(self, scope: str, idem_key: str, token: str) -> None:
        self.lua.run("idem_abandon", [record_key(scope, idem_key)], [token])
