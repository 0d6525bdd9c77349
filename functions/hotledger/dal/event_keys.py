"""The keys that sign the events the service publishes to Kafka (HMAC-SHA256, see outbox/events.py).

The keyring is one JSON secret: {"kid": ..., "key": ..., "previous_kid": ..., "previous_key": ...,
"previous_until": <epoch s>}. Events are signed with `key` and carry `kid`; the previous key is accepted until
`previous_until` (the grace period of a rotation: producers still holding the old keyring in their cache, and
records signed before the rotation still waiting in the topic). `infra/event_keys.py rotate` writes a new one.

In AWS it is a Secrets Manager secret (EVENT_KEYS_SECRET_ARN), read through Powertools parameters and cached for
EVENT_KEYS_MAX_AGE_S; a record naming a key id the cached keyring does not know makes the verifier read the secret
again once (a rotation that happened since). Locally the same JSON comes in EVENT_KEYS (infra/event_keys.py makes
a dev keyring in .state/event-keys.json).

The record value (record_value) is the canonical JSON the MAC covers (sorted keys, no spaces) with `kid` and `mac`
appended last, so the writer checks the MAC over a slice of the bytes it received (signed_part) instead of encoding
every event again (a third of its CPU per event before). A value in any other layout is not the service's: forged.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

# the canonical JSON the MACs cover: one encoder for all, json.dumps would make one per call
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
# the signature as record_value appends it; the MAC is 64 hex digits, the key id a JSON string
_SIGNATURE = re.compile(rb',"kid":("(?:[^"\\]|\\.)*"),"mac":"([0-9a-f]{64})"\}\Z')


def canonical(fields: object) -> bytes:
    """The canonical JSON of a JSON value (an event's fields, or one string of them)."""
    return _CANONICAL.encode(fields).encode()


def record_value(event: dict[str, Any]) -> bytes:
    """The record's bytes: canonical JSON of the event's fields, then its `kid` and `mac` (when signed)."""
    fields = {k: v for k, v in event.items() if k not in ("kid", "mac")}
    body = canonical(fields)
    if "kid" not in event:
        return body
    return with_signature(body, event["kid"], event["mac"])


def with_signature(covered: bytes, kid: str, mac: str) -> bytes:
    """The record's bytes for the canonical JSON `covered` and its signature: `kid` and `mac` appended last."""
    return b'%s,"kid":%s,"mac":"%s"}' % (covered[:-1], canonical(kid), mac.encode())


def signed_part(value: bytes) -> tuple[str, str, bytes] | None:
    """(kid, mac, the bytes the MAC covers) of a value in record_value's layout, or None (another layout)."""
    found = _SIGNATURE.search(value)
    if found is None or found.start() < 2:
        return None
    return _kid(found.group(1)), found.group(2).decode(), value[: found.start()] + b"}"


@functools.lru_cache(maxsize=8)
def _kid(quoted: bytes) -> str:
    """A key id from its JSON string: a batch names one or two, parsed once rather than per record."""
    kid: str = json.loads(quoted)
    return kid


class NoEventKeys(RuntimeError):
    """Neither EVENT_KEYS_SECRET_ARN nor EVENT_KEYS is set: the service cannot sign or verify events."""


@dataclass(frozen=True)
class Keyring:
    kid: str
    key: bytes
    previous_kid: str | None = None
    previous_key: bytes | None = None
    previous_until: float = 0.0  # epoch seconds

    @classmethod
    def parse(cls, value: dict[str, Any]) -> Keyring:
        previous = value.get("previous_kid") and value.get("previous_key")
        return cls(
            value["kid"],
            value["key"].encode(),
            value["previous_kid"] if previous else None,
            value["previous_key"].encode() if previous else None,
            float(value.get("previous_until") or 0) if previous else 0.0,
        )

    def verifying_key(self, kid: str, now_s: float) -> bytes | None:
        """The key that signed under this id, or None (unknown, or the previous key past its grace period)."""
        if kid == self.kid:
            return self.key
        if kid == self.previous_kid and now_s < self.previous_until:
            return self.previous_key
        return None

    def knows(self, kid: str) -> bool:
        return kid in (self.kid, self.previous_kid)


class EventKeys:
    def __init__(self, secret_id: str | None, inline: str | None, max_age_s: int):
        self.secret_id, self.inline, self.max_age_s = secret_id, inline, max_age_s
        self._read: tuple[object, Keyring] | None = None  # the last value read and its keyring: parsed once per value

    def keyring(self, fresh: bool = False) -> Keyring:
        """The current keyring; `fresh` reads the secret again instead of the cached one (Powertools keeps the
        secret's value for max_age_s; each value is parsed once, not once per signed event)."""
        value: dict[str, Any] | str
        if self.secret_id:
            from aws_lambda_powertools.utilities import parameters

            value = parameters.get_secret(self.secret_id, transform="json", max_age=self.max_age_s, force_fetch=fresh)
        elif self.inline:
            value = self.inline
        else:
            raise NoEventKeys("set EVENT_KEYS_SECRET_ARN (Secrets Manager) or EVENT_KEYS (the keyring JSON)")
        if self._read is None or self._read[0] is not value:
            self._read = (value, Keyring.parse(json.loads(value) if isinstance(value, str) else value))
        return self._read[1]
