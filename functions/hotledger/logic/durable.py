"""Making a Redis-side change durable with the configured transport.

Kafka: the script changed Redis; the event is published and the answer waits for the broker's ack. If
the publish fails, the change is undone in Redis unless the writer already claimed it (the event did
arrive after all). Redis Streams: the script XADDed the event itself, atomically with the change, so
there is nothing left to do.
"""
from __future__ import annotations

from collections.abc import Callable

import redis

from hotledger import errors
from hotledger.config import Settings
from hotledger.dal.publisher import PublishFailed
from hotledger.dal.redis_store import text


def stream_flag(cfg: Settings) -> str:
    """The scripts' ARGV switch: 'stream' makes them XADD their event."""
    return "stream" if cfg.event_transport == "redis-stream" else ""


class Durability:
    def __init__(self, cfg: Settings, publish: Callable[[str, dict], None]):
        self.streamed = cfg.event_transport == "redis-stream"
        self.publish = publish

    def publish_or_undo(self, key: str, event: Callable[[], dict], undo: Callable[[], list],
                        unknown: Callable[[str], errors.DomainError]) -> None:
        """Kafka only: publish, or undo the change. `undo` runs a rollback script and returns its reply;
        `unknown(why)` builds the OUTCOME_UNKNOWN error when even the undo cannot reach Redis."""
        if self.streamed:
            return
        try:
            self.publish(key, event())
        except PublishFailed as exc:
            try:
                verdict = text(undo()[0])
            except redis.RedisError as lost:
                # the change stays pending: if Redis kept it, the reconciler persists it; if not, it never happened
                raise unknown("the broker did not acknowledge it and Redis could not take it back") from lost
            if verdict != "claimed":  # claimed: the event did arrive and will be persisted
                raise errors.PublishFailed("the change could not be recorded durably and was not made; retry") from exc
