"""What travels from a Redis-side change to the DB: one event shape per feature, and the one decode that
Kafka records (the writer) and Redis Stream entries (the stream consumer) go through."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
)


class LedgerEvent(BaseModel):
    """One Redis-side change travelling to the DB (the Kafka record value)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["ledger"]
    id: Annotated[StrictInt, Field(gt=0)]
    kind: Literal["D", "R"]
    user_id: Annotated[StrictInt, Field(gt=0)]
    amount: Annotated[StrictInt, Field(gt=0)]
    balance_after: StrictInt
    version: StrictInt
    epoch: str
    ts: StrictInt
    open: str
    idem_key: str | None = None

    @property
    def delta(self) -> int:
        return -self.amount if self.kind == "D" else self.amount


class VoucherOrderEvent(BaseModel):
    """A flash-sale order taken in Redis, travelling to the DB."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["voucher_order"]
    id: Annotated[StrictInt, Field(gt=0)]
    voucher_id: Annotated[StrictInt, Field(gt=0)]
    user_id: Annotated[StrictInt, Field(gt=0)]
    seq: Annotated[StrictInt, Field(gt=0)]
    ts: StrictInt
    epoch: str


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


AnyEvent = Annotated[LedgerEvent | VoucherOrderEvent | RedPacketClaimEvent, Field(discriminator="type")]
EVENT_ADAPTER = TypeAdapter(AnyEvent)


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


def decode(records: Iterable[RawRecord]) -> tuple[list, list[PoisonRecord]]:
    """Records -> events in their order, plus the records that can never be applied (undecodable)."""
    events, poison = [], []
    for record in records:
        try:
            events.append(EVENT_ADAPTER.validate_json(record.value or b""))
        except (ValueError, ValidationError) as exc:
            poison.append(PoisonRecord(record.topic, record.partition, record.offset, record.key, record.value, str(exc)))
    return events, poison
