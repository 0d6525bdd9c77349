"""What travels from a Redis-side change to the DB: one event shape per feature, and the one decode that
Kafka records (the writer) and Redis Stream entries (the stream consumer) go through.

Kafka events are signed: the service adds `kid` (the key id) and `mac`, an HMAC-SHA256 over the event's fields
(its model's fields, as canonical JSON: sorted keys, no spaces) with the keyring's current key (dal/event_keys.py),
published as those very bytes with `kid` and `mac` appended, so the writer checks the MAC over what it received.
The writer applies only events whose MAC matches under the key they name (the previous key during a rotation's grace
period); anything else - no MAC, an unknown or retired key, a field changed after signing - is dead-lettered with the
reason and changes nothing, so a client that can reach the topic cannot mint money by publishing a recharge.
Redis Stream entries are not signed: the Lua scripts XADD them in the same step that changes Redis, inside the
trusted Redis (TLS + AUTH), and whoever can write there can change the balances directly; the reconciler rebuilds
events from Redis entry strings, also inside that boundary.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
)

from hotledger.dal.event_keys import EventKeys, Keyring, canonical, signed_part, with_signature
from hotledger.ledger.kinds import KINDS, balance_delta, hold_delta


class LedgerEvent(BaseModel):
    """One Redis-side change travelling to the DB (the Kafka record value)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["ledger"]
    id: Annotated[StrictInt, Field(gt=0)]
    kind: Literal[tuple(KINDS)]  # type: ignore[valid-type]  # the letters of ledger/kinds.py: a kind is added there
    user_id: Annotated[StrictInt, Field(gt=0)]
    amount: Annotated[StrictInt, Field(gt=0)]
    balance_after: StrictInt
    version: StrictInt
    epoch: str
    ts: StrictInt
    open: str
    idem_key: str | None = None
    # a hold's change only (left out of a deduct's or recharge's event)
    hold_id: Annotated[StrictInt, Field(gt=0)] | None = None
    released: Annotated[StrictInt, Field(ge=0)] = 0  # what a void, expiry or final capture gave back to available
    expires_at: StrictInt | None = None
    available_after: StrictInt | None = None
    hold_state: Literal["ACTIVE", "CAPTURED", "VOIDED", "EXPIRED"] | None = None
    captured_after: Annotated[StrictInt, Field(ge=0)] | None = None
    description: Annotated[str, Field(max_length=500)] | None = None
    # a refund only: the charge it gives back (a deduct's order id or a hold's id) and that charge's refunded total
    refund_of: Annotated[StrictInt, Field(gt=0)] | None = None
    refund_of_kind: Literal["order", "hold"] | None = None
    refunded_after: Annotated[StrictInt, Field(gt=0)] | None = None
    reason: Annotated[str, Field(max_length=500)] | None = None
    # credit grants (grants/): a recharge's grant (its id is the entry's), what a deduct spent of which grants
    # ('<grant id>:<amount>,...', first-to-expire) and the grant an expiry (kind G) ends
    grant_expires_at: Annotated[StrictInt, Field(gt=0)] | None = None
    grant_category: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] | None = None
    grants_spent: Annotated[str, Field(pattern=r"^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$")] | None = None
    # a refund's parts given back to the live grants its charge spent (grants.rows.refund_parts)
    grants_refunded: Annotated[str, Field(pattern=r"^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$")] | None = None
    grant_id: Annotated[StrictInt, Field(gt=0)] | None = None

    @property
    def delta(self) -> int:
        """What the change adds to the balance: a hold moves only `available`, until a capture takes from the balance."""
        return balance_delta(self.kind, self.amount)

    @property
    def hold_delta(self) -> int:
        """What the change adds to what holds keep out of available."""
        return hold_delta(self.kind, self.amount, self.released)


class VoucherOrderEvent(BaseModel):
    """A flash-sale order taken in Redis, travelling to the DB."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["voucher_order"]
    id: Annotated[StrictInt, Field(gt=0)]
    voucher_id: Annotated[StrictInt, Field(gt=0)]
    user_id: Annotated[StrictInt, Field(gt=0)]
    seq: Annotated[StrictInt, Field(gt=0)]
    ts: StrictInt
    epoch: str  # the load of the bucket the unit came from
    bucket: Annotated[StrictInt, Field(ge=0)] = 0  # the stock bucket the unit came from
    home: Annotated[StrictInt, Field(ge=0)] = 0  # the bucket holding the buyer's record (orders taken)


class RedPacketClaimEvent(BaseModel):
    """A red packet grabbed in Redis, travelling to the DB."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["redpacket_claim"]
    packet_id: Annotated[StrictInt, Field(gt=0)]
    item_id: Annotated[StrictInt, Field(gt=0)]
    user_id: Annotated[StrictInt, Field(gt=0)]
    amount: Annotated[StrictInt, Field(gt=0)]
    ts: StrictInt
    grab_id: Annotated[StrictInt, Field(gt=0)]  # unique per grab: an item rolled back is grabbed again under a new id


Event = LedgerEvent | VoucherOrderEvent | RedPacketClaimEvent
AnyEvent = Annotated[Event, Field(discriminator="type")]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(AnyEvent)


@dataclass(frozen=True)
class PoisonRecord:
    """A record that can never be applied: it is dead-lettered, not retried."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: str


@dataclass(frozen=True)
class RawRecord:
    """Where a record came from (Kafka topic/partition/offset, or a stream and its entry id as a number) and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class Forged(ValueError):
    """A record the service did not sign as it stands."""


def _mac(key: bytes, covered: bytes) -> str:
    # hmac.digest: the one-shot C path, a few times cheaper per event than an hmac.new object
    return hmac.digest(key, covered, hashlib.sha256).hex()


def signed_value(event: dict[str, Any], keyring: Keyring) -> bytes:
    """The record value of the signed event, record_value(signed(event, keyring)), with the canonical JSON encoded
    once: the bytes the MAC covers are the record's own."""
    covered = canonical(event)
    return with_signature(covered, keyring.kid, _mac(keyring.key, covered))


def signed(event: dict[str, Any], keyring: Keyring) -> dict[str, Any]:
    """The event (an event model's model_dump()) with the current key's id and its MAC; published as
    record_value(signed(...)), the layout the writer checks without encoding the event again."""
    return {**event, "kid": keyring.kid, "mac": _mac(keyring.key, canonical(event))}


class _Verifier:
    """Checks MACs against the keyring, reading the secret again at most once per batch for a key id it does not
    know (keys rotated since the keyring was cached)."""

    def __init__(self, keys: EventKeys):
        self.keys, self.keyring, self.refreshed = keys, keys.keyring(), False

    def check(self, kid: object, mac: object, covered: Callable[[], bytes]) -> None:
        """Raises Forged unless `mac` is the MAC of covered() under the key `kid` names."""
        if not isinstance(kid, str) or not isinstance(mac, str):
            raise Forged("forged: the record carries no signature (kid, mac)")
        if not self.keyring.knows(kid) and not self.refreshed:
            self.keyring, self.refreshed = self.keys.keyring(fresh=True), True
        key = self.keyring.verifying_key(kid, time.time())
        if key is None:
            raise Forged(f"forged: signed with key {kid!r}, which is unknown or past its grace period")
        if not hmac.compare_digest(mac, _mac(key, covered())):
            raise Forged(f"forged: the MAC does not match the record's fields under key {kid!r}")


def _verified(value: bytes, verifier: _Verifier) -> Event:
    """The event of a signed record value, or Forged. The layout record_value writes is the only one: the MAC over
    the value's own bytes, then one parse; the signed bytes are the record's fields, so the event is what was signed."""
    part = signed_part(value)
    if part is None:
        raise Forged("forged: the record carries no signature in the service's layout (its fields, then kid and mac)")
    kid, mac, covered = part
    verifier.check(kid, mac, lambda: covered)
    return EVENT_ADAPTER.validate_json(value)


def decode(records: Iterable[RawRecord], keys: EventKeys | None) -> tuple[list[Event], list[PoisonRecord]]:
    """Records -> events in their order, plus the records that can never be applied (undecodable or, with `keys`,
    not signed by the service). `keys` is None only for Redis Stream entries (see the module's docstring)."""
    events: list[Event] = []
    poison: list[PoisonRecord] = []
    verifier = None
    for record in records:
        try:
            if keys is None:
                event = EVENT_ADAPTER.validate_json(record.value or b"")
            else:
                verifier = verifier or _Verifier(keys)
                event = _verified(record.value or b"", verifier)
            events.append(event)
        except (ValueError, ValidationError) as exc:
            poison.append(
                PoisonRecord(record.topic, record.partition, record.offset, record.key, record.value, str(exc))
            )
    return events, poison
