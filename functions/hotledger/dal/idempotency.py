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
- Durable keys (`durable=True`) are also kept in the DB (t_route_key) without expiry: the note before the effect, the
  answer after it. A key Redis does not know (a new key, or one Redis lost) is looked up there once, so a retry after
  a Redis loss replays the answer, or resumes from the note of an attempt that died before answering.
- A scope opens at most `max_keys` new keys per `ttl_s` window (the window starts at its first key): past it a new
  key is refused (TOO_MANY_KEYS) while the keys it holds still answer, so one caller cannot fill Redis.

The scripts are layers/lua/idem_begin.lua, idem_note.lua, idem_finish.lua and idem_abandon.lua.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from enum import Enum

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, reply_fields

DAY_S = 24 * 3600
LEASE_MS = 60_000  # above the API function's 30 s timeout: a live attempt never loses its key
MAX_KEYS = 100_000  # new keys per scope and window (MAX_IDEMPOTENCY_KEYS)


class BeginStatus(Enum):
    NEW = "new"
    REPLAY = "replay"
    CONFLICT = "conflict"
    RUNNING = "running"
    TOO_MANY = "too_many"


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


def quota_key(scope: str) -> str:
    """How many keys the scope opened in the current window (idem_begin, idem_abandon)."""
    return f"idem:quota:{keys.tag(scope)}"


class Idempotency:
    def __init__(self, lua: Lua, ttl_s: int = DAY_S, lease_ms: int = LEASE_MS, max_keys: int = MAX_KEYS):
        self.lua, self.ttl_s, self.lease_ms, self.max_keys = lua, ttl_s, lease_ms, max_keys

    def begin(self, scope: str, idem_key: str, fingerprint: str, durable: bool = False) -> Begun:
        now_ms = int(time.time() * 1000)
        # the hold's start leads its token, so tokens of one key order as their holds: a later hold (one that took the
        # key over after this one's lease ran out) sorts after, and the DB row keeps what the latest wrote
        token = f"{now_ms:013d}{uuid.uuid4().hex[:19]}"
        reply = reply_fields(
            self.lua.run(
                "idem_begin",
                [record_key(scope, idem_key), quota_key(scope)],
                [fingerprint, token, now_ms, self.lease_ms, self.ttl_s, self.max_keys],
            )
        )
        if reply[0] == "retaken":
            return Begun(BeginStatus.NEW, token=token, retaken=True, note=reply[1] or None)
        status = BeginStatus(reply[0])
        if status is BeginStatus.REPLAY:
            return Begun(status, answer_status=int(reply[1]), body=reply[2])
        if status is BeginStatus.NEW and durable:
            return self._from_db(scope, idem_key, fingerprint, token)
        return Begun(status, token=token if status is BeginStatus.NEW else "")

    def _from_db(self, scope: str, idem_key: str, fingerprint: str, token: str) -> Begun:
        """A key Redis did not know: what the DB kept of it. Its answer is replayed (and kept in Redis again); a note
        without an answer is the recovery point of an attempt that died (or whose Redis record was lost)."""
        try:
            rows = db.query(
                "SELECT fingerprint, note, status, response FROM t_route_key WHERE scope = %s AND idem_key = %s",
                (scope, idem_key),
            )
        except db.DatabaseUnavailable:
            self.abandon(scope, idem_key, token)  # the key's past is unknown: nothing may run under it yet
            raise
        if not rows:
            return Begun(BeginStatus.NEW, token=token)
        stored_fp, note, status, response = rows[0]
        if stored_fp != fingerprint:
            self.abandon(scope, idem_key, token)
            return Begun(BeginStatus.CONFLICT)
        if status is None:
            self.note(scope, idem_key, token, note)
            return Begun(BeginStatus.NEW, token=token, retaken=True, note=note)
        self._keep_answer(scope, idem_key, token, status, response)
        return Begun(BeginStatus.REPLAY, answer_status=int(status), body=response)

    def note(
        self, scope: str, idem_key: str, token: str, note: str, durable: bool = False, fingerprint: str = ""
    ) -> bool:
        """Keep the holder's recovery point (durable: in the DB too, before the effect it names); False when the
        record is no longer this attempt's: the caller must stop before any effect. Redis first, as it holds the
        lease: an attempt that takes the key over later resumes from this point, whatever the DB write meets."""
        if reply_fields(self.lua.run("idem_note", [record_key(scope, idem_key)], [token, note]))[0] != "noted":
            return False
        if durable:  # a hold that lost the key while this write stalled cannot overwrite its successor's point
            latest = "(status IS NULL AND (token IS NULL OR VALUES(token) >= token))"
            db.execute(
                "INSERT INTO t_route_key (scope, idem_key, fingerprint, note, token) VALUES (%s, %s, %s, %s, %s)"
                f" ON DUPLICATE KEY UPDATE note = IF({latest}, VALUES(note), note),"
                f" token = IF({latest}, VALUES(token), token)",
                (scope, idem_key, fingerprint, note, token),
            )
        return True

    def finish(
        self,
        scope: str,
        idem_key: str,
        token: str,
        status: int,
        body: str,
        durable: bool = False,
        fingerprint: str = "",
    ) -> bool:
        """Keep the answer (durable: in the DB first, for good); False when the record is no longer this attempt's.
        In the DB an earlier hold than the row's latest (one that lost the key) writes nothing."""
        if durable:
            latest = "(token IS NULL OR VALUES(token) >= token)"
            db.execute(
                "INSERT INTO t_route_key (scope, idem_key, fingerprint, status, response, token)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                f" ON DUPLICATE KEY UPDATE status = IF({latest}, VALUES(status), status),"
                f" response = IF({latest}, VALUES(response), response), token = IF({latest}, VALUES(token), token)",
                (scope, idem_key, fingerprint, status, body, token),
            )
        return self._keep_answer(scope, idem_key, token, status, body)

    def _keep_answer(self, scope: str, idem_key: str, token: str, status: int, body: str) -> bool:
        reply = reply_fields(
            self.lua.run("idem_finish", [record_key(scope, idem_key)], [token, status, body, self.ttl_s])
        )
        return reply[0] == "done"

    def abandon(self, scope: str, idem_key: str, token: str, forget_note: bool = False) -> None:
        """Give the key back (nothing changed); forget_note: its recovery point in the DB goes too, so no later attempt
        resumes work that was taken back (a rolled-back order id)."""
        if forget_note:
            db.execute(
                "DELETE FROM t_route_key WHERE scope = %s AND idem_key = %s AND status IS NULL", (scope, idem_key)
            )
        self.lua.run("idem_abandon", [record_key(scope, idem_key), quota_key(scope)], [token])
