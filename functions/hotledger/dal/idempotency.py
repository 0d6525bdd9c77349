"""Idempotency-Keys of the routes that move money or stock outside the ledger's own charges (red packets, grabs,
voucher orders, payment orders): one Redis record per (scope, key), Stripe's model.

- The record is bound to the first request's fingerprint (route and body): another request with the key is a
  conflict (409 IDEMPOTENCY_KEY_REUSED).
- The attempt that opened it holds it for a lease (longer than the API function's timeout); another attempt in that
  time is told the first one is in flight (409 IDEMPOTENCY_IN_PROGRESS). An attempt that died holding it loses it
  when the lease runs out, and the next attempt runs the request again.
- The holder may keep a recovery point (a note: what it reserved before any effect, such as a red packet's id);
  an attempt that takes over a dead holder's record gets it and resumes that work (Stripe's recovery points).
- The first definitive answer (status and body, a business refusal included) is kept and replayed for the record's
  life (24 h, Stripe's lifetime); an attempt that changed nothing (a transient 503) gives the key back.

The scripts are layers/lua/idem_begin.lua, idem_note.lua, idem_finish.lua and idem_abandon.lua.
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
    """idem_begin.lua's answer: NEW (the caller runs the request and holds the record with `token`; `retaken` when it
    took the record over from an attempt that died, with that attempt's `note` or None), REPLAY (the key's answer:
    `answer_status` and `body`), CONFLICT or RUNNING."""

    status: BeginStatus
    token: str = ""
    answer_status: int | None = None
    body: str | None = None
    retaken: bool = False
    note: str | None = None


def record_key(scope: str, idem_key: str) -> str:
    return f"idem:{keys.tag(scope)}:{idem_key}"


class Idempotency:
    def __init__(self, lua: Lua, ttl_s: int = DAY_S, lease_ms: int = LEASE_MS):
        self.lua, self.ttl_s, self.lease_ms = lua, ttl_s, lease_ms

    def begin(self, scope: str, idem_key: str, fingerprint: str) -> Begun:
        token = uuid.uuid4().hex
        reply = reply_fields(self.lua.run("idem_begin", [record_key(scope, idem_key)],
                                          [fingerprint, token, int(time.time() * 1000), self.lease_ms, self.ttl_s]))
        if reply[0] == "retaken":
            return Begun(BeginStatus.NEW, token=token, retaken=True, note=reply[1] or None)
        status = BeginStatus(reply[0])
        if status is BeginStatus.REPLAY:
            return Begun(status, answer_status=int(reply[1]), body=reply[2])
        return Begun(status, token=token if status is BeginStatus.NEW else "")

    def note(self, scope: str, idem_key: str, token: str, note: str) -> bool:
        """Keep the holder's recovery point; False when the record is no longer this attempt's."""
        return reply_fields(self.lua.run("idem_note", [record_key(scope, idem_key)], [token, note]))[0] == "noted"

    def finish(self, scope: str, idem_key: str, token: str, status: int, body: str) -> bool:
        """Keep the answer; False when the record is no longer this attempt's."""
        reply = reply_fields(self.lua.run("idem_finish", [record_key(scope, idem_key)], [token, status, body, self.ttl_s]))
        return reply[0] == "done"

    def abandon(self, scope: str, idem_key: str, token: str) -> None:
        self.lua.run("idem_abandon", [record_key(scope, idem_key)], [token])
