"""The one step every money- or stock-moving request takes: change Redis with one script, then make the
change durable with the configured transport before answering.

Kafka: the script changed Redis; the event is published and the answer waits for the broker's ack. If the
publish fails, the change is undone in Redis unless the writer already claimed it (the event did arrive after
all). Redis Streams: the script XADDed the event itself, atomically with the change: nothing is left to do.

Invariants this step keeps for all three features (ledger, vouchers, red packets):
- every attempt runs with fresh ids, so a resend of one attempt is recognised by the script, never a new change;
- a script that may have run without answering is OUTCOME_UNKNOWN (never "nothing changed");
- an entity Redis does not hold is loaded from the DB and the script tried again (at most LOAD_ATTEMPTS times);
- a refusal changes nothing and is raised as its domain error;
- a change is answered only once it is durable, or undone, or reported OUTCOME_UNKNOWN when even the undo
  cannot reach Redis.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from hotledger import errors
from hotledger.config import Settings
from hotledger.dal import db
from hotledger.dal.event_keys import EventKeys
from hotledger.dal.publisher import NotAcknowledged
from hotledger.dal.redis_store import RedisOutcomeUnknown, RedisUnavailable, stream_flag
from hotledger.outbox.events import signed_value

LOAD_ATTEMPTS = 3


class ScriptReply(Protocol):
    @property
    def missing(self) -> bool:
        """Redis does not hold the entity: load it from the DB and run the script again."""


Reply = TypeVar("Reply", bound=ScriptReply)


# not frozen: one is built per charge, and a frozen dataclass sets each field through object.__setattr__
@dataclass
class Outbound:
    """A change a script made in Redis, to be made durable."""

    key: str  # partition key: every event of one entity lands in one partition, in order
    event: Callable[[], dict[str, Any]]  # the event model's model_dump()
    # takes the change back; True when it stands instead: the writer had it first (ledger: persisted, as the DB
    # decides under the account row lock; vouchers, red packets: claimed in Redis)
    undo: Callable[[], bool]
    # after the broker's ack: what waited for the change to be durable (ledger credits: their hold is released so
    # they can be spent). Best effort: the writer's settle does it too, once the change is in the DB
    made_durable: Callable[[], object] | None = None


class Change(Protocol[Reply]):
    """One charge-then-make-durable step of a feature, as Durability.apply runs it: the contract every money- or
    stock-moving change implements (the ledger's charge, a hold's change, a refund, a voucher order, a grab)."""

    @property
    def what(self) -> str:
        """Named in the errors: "charge", "order of voucher 7", ... (read-only: a frozen Step or a class
        attribute implements it)."""

    def attempt(self, change_id: int) -> Reply:
        """One script call under a fresh id (a resend of the same attempt is recognised by the script)."""

    def reload(self) -> None:
        """Redis does not hold the entity: load it from the DB."""

    def refusal(self, reply: Reply) -> errors.DomainError | None:
        """The reply's refusal, if it is one (it changed nothing)."""

    def outbound(self, change_id: int, reply: Reply) -> Outbound | None:
        """What to make durable (None: nothing new, e.g. a replayed answer)."""

    def unknown(self, change_id: int, why: str) -> errors.DomainError:
        """OUTCOME_UNKNOWN naming the change to look up."""


@dataclass(frozen=True)
class Step(Generic[Reply]):
    """A Change given as its parts, for a feature whose step needs no state of its own between its parts."""

    what: str
    attempt: Callable[[int], Reply]
    reload: Callable[[], None]
    refusal: Callable[[Reply], errors.DomainError | None]
    outbound: Callable[[int, Reply], Outbound | None]
    unknown: Callable[[int, str], errors.DomainError]


class Durability:
    def __init__(
        self, cfg: Settings, publish: Callable[[str, bytes], None], next_id: Callable[[], int], keys: EventKeys
    ):
        self.streamed = cfg.event_transport == "redis-stream"
        self.stream_flag = stream_flag(cfg)
        self.publish = publish
        self.next_id = next_id
        self.keys = keys

    def send(self, key: str, event: dict[str, Any]) -> None:
        """Sign the event with the current key and publish it; NotAcknowledged if either fails."""
        try:
            keyring = self.keys.keyring()
        except Exception as exc:
            raise NotAcknowledged(f"the event could not be signed: {exc!r}") from exc
        self.publish(key, signed_value(event, keyring))

    def apply(self, change: Change[Reply]) -> tuple[int, Reply]:
        """Run the change's attempt (one script call) until Redis holds the entity, raise its refusal, make it
        durable; returns (the change id of the attempt that answered, its reply)."""
        for _ in range(LOAD_ATTEMPTS):
            change_id = self.next_id()
            try:
                reply = change.attempt(change_id)
            except RedisOutcomeUnknown as exc:
                raise change.unknown(change_id, f"Redis did not answer the {change.what}") from exc
            if reply.missing:
                change.reload()
                continue
            error = change.refusal(reply)
            if error is not None:
                raise error
            outbound = change.outbound(change_id, reply)
            if outbound is not None:
                self.publish_or_undo(outbound, functools.partial(_unknown_of, change, change_id))
            return change_id, reply
        raise errors.ServiceUnavailable(f"the {change.what} could not be loaded into Redis; retry")

    def publish_or_undo(self, change: Outbound, unknown: Callable[[str], errors.DomainError]) -> None:
        """Kafka only: publish, or undo the change."""
        if self.streamed:
            return
        try:
            self.send(change.key, change.event())
        except NotAcknowledged as exc:
            try:
                claimed = change.undo()
            except (RedisUnavailable, db.DatabaseUnavailable) as lost:
                # no verdict, or Redis could not give it back: the change stays pending and the DB's record decides
                # (rolled back: the writer or the reconciler gives it back in Redis; not: the reconciler persists it)
                raise unknown("the broker did not acknowledge it and it could not be taken back") from lost
            if not claimed:  # claimed: the event did arrive and will be persisted
                raise errors.PublishFailed("the change could not be recorded durably and was not made; retry") from exc
            return
        if change.made_durable is not None:
            # the change is durable; what waited on it follows when the writer settles it
            with contextlib.suppress(RedisUnavailable):
                change.made_durable()


def _unknown_of(change: Change[Reply], change_id: int, why: str) -> errors.DomainError:
    """The change's OUTCOME_UNKNOWN for the attempt `change_id`."""
    return change.unknown(change_id, why)
