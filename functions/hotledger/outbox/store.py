"""The outbox's storage: the fate claim every persister takes before its commit (outbox_claim.lua), the
dead-letter table, and the Redis Streams transport's consumer-group calls."""
from __future__ import annotations

from dataclasses import dataclass

import redis

from hotledger.dal import db
from hotledger.dal.redis_store import Lua, redis_errors_translated, text
from hotledger.outbox.events import PoisonRecord


@redis_errors_translated
class OutboxStore:
    def __init__(self, lua: Lua, fate_ttl_s: int):
        self.lua, self.fate_ttl_s = lua, fate_ttl_s

    def claim(self, groups: list[list[str]]) -> list[list[bool]]:
        """Mark fate keys 'claimed': one script call per group of same-slot keys, pipelined. False where the API
        rolled the change back first (its tombstone wins: the change is never persisted)."""
        if not groups:
            return []
        pipe = self.lua.pipeline()
        for fate_keys in groups:
            self.lua.run("outbox_claim", fate_keys, [self.fate_ttl_s], client=pipe)
        return [[mark == 1 for mark in marks] for marks in pipe.execute()]

    @staticmethod
    def dead_letter(cur, records: list[PoisonRecord]) -> int:
        """Record what can never apply, once (unique by topic, partition, offset), in the caller's transaction."""
        if not records:
            return 0
        cur.execute("INSERT IGNORE INTO t_dead_letter (topic, partition_no, offset_no, record_key, record_value, error) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(records)),
                    [v for r in records for v in (r.topic, r.partition, r.offset, r.key, r.value, r.error[:1024])])
        return len(records)

    def dead_letter_alone(self, records: list[PoisonRecord]) -> int:
        """dead_letter in a transaction of its own."""
        with db.transaction() as cur:
            return self.dead_letter(cur, records)


@dataclass(frozen=True)
class StreamEntry:
    """One event in a Redis Stream: its entry id ('ms-seq'), the event bytes, and how often it was delivered."""

    entry_id: str
    value: bytes
    deliveries: int = 1

    @property
    def offset(self) -> int:
        """The entry id as one number (ms * 1000 + seq), the dead letters' offset."""
        millis, seq = self.entry_id.split("-")
        return int(millis) * 1000 + int(seq)


def _entries(raw) -> list[StreamEntry]:
    # an entry deleted while pending comes back with no fields: nothing to retry
    return [StreamEntry(text(entry_id), fields.get(b"e", b"")) for entry_id, fields in raw if fields is not None]


@redis_errors_translated
class EventStreams:
    """The Redis Streams transport's consumer-group calls (EVENT_TRANSPORT=redis-stream)."""

    def __init__(self, client: redis.Redis, group: str):
        self.redis, self.group = client, group

    def ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read_new(self, consumer: str, streams: list[str], count: int, block_ms: int) -> list[tuple[str, list[StreamEntry]]]:
        replies = self.redis.xreadgroup(self.group, consumer, {s: ">" for s in streams}, count=count, block=block_ms)
        return [(text(stream), _entries(entries)) for stream, entries in replies or []]

    def reclaim(self, stream: str, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]:
        """Entries other consumers left pending longer than min_idle_ms, now this consumer's, with their delivery counts."""
        _, raw, _ = self.redis.xautoclaim(stream, self.group, consumer, min_idle_time=min_idle_ms, count=count)
        entries = _entries(raw)
        if not entries:
            return []
        counts = {text(p["message_id"]): p["times_delivered"] for p in self.redis.xpending_range(
            stream, self.group, min=entries[0].entry_id, max=entries[-1].entry_id, count=len(entries), consumername=consumer)}
        return [StreamEntry(e.entry_id, e.value, counts.get(e.entry_id, 0)) for e in entries]

    def ack(self, stream: str, entry_ids: list[str]) -> None:
        """Acknowledge and delete (the stream does not grow)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(stream, self.group, *entry_ids)
        pipe.xdel(stream, *entry_ids)
        pipe.execute()

    def dead_letter(self, dead_stream: str, entry: StreamEntry, error: str) -> None:
        self.redis.xadd(dead_stream, {"e": entry.value, "id": entry.entry_id, "error": error[:1024]})

    def forget_idle_consumers(self, streams: list[str], keep: str, idle_ms: int) -> int:
        """Drop the consumers idle longer than idle_ms with nothing pending (each drainer run is its own consumer)."""
        removed = 0
        for stream in streams:
            for consumer in self.redis.xinfo_consumers(stream, self.group):
                if consumer["pending"] == 0 and consumer["idle"] > idle_ms and text(consumer["name"]) != keep:
                    removed += self.redis.xgroup_delconsumer(stream, self.group, consumer["name"])
        return removed
