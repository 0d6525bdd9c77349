"""The outbox's storage: the fate claim every persister takes before its commit (outbox_claim.lua), the
dead-letter table, the writer's log watermark (t_log_watermark) with the log hold of rebuilt entities
(outbox_hold_swap.lua), and the Redis Streams transport's consumer-group calls."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import redis

from hotledger import keys
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
    def dead_letter(cur: db.Cursor, records: list[PoisonRecord]) -> int:
        """Record what can never apply, once (unique by topic, partition, offset), in the caller's transaction."""
        if not records:
            return 0
        cur.execute(
            "INSERT IGNORE INTO t_dead_letter (topic, partition_no, offset_no, record_key, record_value, error) VALUES "
            + ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(records)),
            [v for r in records for v in (r.topic, r.partition, r.offset, r.key, r.value, r.error[:1024])],
        )
        return len(records)

    def dead_letter_alone(self, records: list[PoisonRecord]) -> int:
        """dead_letter in a transaction of its own."""
        with db.transaction() as cur:
            return self.dead_letter(cur, records)

    @staticmethod
    def dead_letters(limit: int, before_id: int | None = None) -> list[DeadLetter]:
        """The writer's dead letters, newest first (before_id: those older than it)."""
        where, args = ("WHERE id < %s", (before_id,)) if before_id else ("", ())
        return [
            DeadLetter(*row) for row in db.query(f"{_DEAD_LETTER} {where} ORDER BY id DESC LIMIT %s", (*args, limit))
        ]

    @staticmethod
    def dead_letters_by_id(ids: list[int]) -> list[DeadLetter]:
        if not ids:
            return []
        return [
            DeadLetter(*row)
            for row in db.query(f"{_DEAD_LETTER} WHERE id IN ({','.join(['%s'] * len(ids))}) ORDER BY id", ids)
        ]

    @staticmethod
    def unreplayed_dead_letters(limit: int) -> list[DeadLetter]:
        return [
            DeadLetter(*row)
            for row in db.query(
                f"{_DEAD_LETTER} WHERE replayed_at IS NULL AND topic <> %s ORDER BY id LIMIT %s",
                (REJECTED_TOPIC, limit),
            )
        ]

    @staticmethod
    def mark_replayed(dead_letter_id: int, now_ms: int) -> None:
        db.execute("UPDATE t_dead_letter SET replayed_at = %s WHERE id = %s", (now_ms, dead_letter_id))

    # the log watermark and the hold of rebuilt entities --------------------------------------------------
    @staticmethod
    def record_applied(offsets: dict[tuple[str, int], int]) -> None:
        """(topic, partition) -> the last offset of a batch the writer applied whole. Set, not raised with
        GREATEST: a re-delivered older batch lowers it for a while (later holds wait longer, never shorter), and
        a broker that lost its log and numbers from 0 again is followed."""
        if offsets:
            db.execute(
                "INSERT INTO t_log_watermark (topic, partition_no, applied_offset) VALUES "
                + ",".join(["(%s,%s,%s)"] * len(offsets))
                + " ON DUPLICATE KEY UPDATE applied_offset = VALUES(applied_offset)",
                [v for (topic, partition), offset in offsets.items() for v in (topic, partition, offset)],
            )

    @staticmethod
    def applied_offsets(topic: str) -> dict[int, int]:
        """partition -> the offset up to which the writer applied every record of the topic."""
        return dict(db.query("SELECT partition_no, applied_offset FROM t_log_watermark WHERE topic = %s", (topic,)))

    def log_hold(self, hold_key: str) -> str:
        """The hold_log field of a rebuilt entity's hash ('' when it has no log hold)."""
        return text(self.lua.client.hget(hold_key, "hold_log") or b"")

    def swap_log_hold(self, hold_key: str, read: str, new: str) -> str:
        """Set hold_log from `read` to `new` ('': lift the hold), only if it still holds `read`; returns what it holds."""
        held: bytes = self.lua.run("outbox_hold_swap", [hold_key], [read, new])  # a bulk string, '' for no hold
        return text(held)


# persisters' own refusals (outbox.writer.rejected): records that decoded and verified but the DB refused; their
# changes were settled as refused (given back in Redis), so they are final, never replayed
REJECTED_TOPIC = "rejected-entries"
_DEAD_LETTER = (
    "SELECT id, topic, partition_no, offset_no, record_key, record_value, error, create_time, replayed_at"
    " FROM t_dead_letter"
)


@dataclass(frozen=True)
class DeadLetter:
    """A record the writer set aside (t_dead_letter): where it came from, its bytes, why, and when it was replayed."""

    dead_letter_id: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: str
    created_at: datetime  # the DB's DATETIME (naive UTC)
    replayed_at: int | None

    @property
    def final(self) -> bool:
        """Refused by the DB after it verified: its change was given back, a replay could only repeat the refusal."""
        return self.topic == REJECTED_TOPIC


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


@dataclass(frozen=True)
class DeadStreamEntry:
    """An entry the stream consumer set aside (events:dead:{s<n>}): its id there, its id in the stream, why, its bytes."""

    entry_id: str
    stream_entry_id: str
    error: str
    value: bytes


def _entries(raw: Iterable[tuple[bytes, Mapping[bytes, bytes] | None]]) -> list[StreamEntry]:
    """Stream entries as redis-py answers them over RESP2, undecoded: (entry id, fields)."""
    # an entry deleted while pending comes back with no fields: nothing to retry
    return [StreamEntry(text(entry_id), fields.get(b"e", b"")) for entry_id, fields in raw if fields is not None]


@redis_errors_translated
class EventStreams:
    """The Redis Streams transport's consumer-group calls (EVENT_TRANSPORT=redis-stream)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, group: str):
        self.redis, self.group = client, group

    def ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read_new(
        self, consumer: str, streams: list[str], count: int, block_ms: int
    ) -> list[tuple[str, list[StreamEntry]]]:
        """Up to `count` new entries per stream, waiting up to block_ms when there are none."""
        if not isinstance(self.redis, redis.RedisCluster) or len(streams) == 1:
            return self._read_new(consumer, streams, count, block_ms)
        # a cluster command touches one slot, and the shards' streams are spread over the slots: each is read on its
        # own, first without waiting, then, all empty, waiting on each in turn for its share of block_ms
        found = [reply for stream in streams for reply in self._read_new(consumer, [stream], count, None)]
        if not found:
            for stream in streams:
                found = self._read_new(consumer, [stream], count, max(1, block_ms // len(streams)))
                if found:
                    break
        return found

    def _read_new(
        self, consumer: str, streams: list[str], count: int, block_ms: int | None
    ) -> list[tuple[str, list[StreamEntry]]]:
        replies = self.redis.xreadgroup(self.group, consumer, {s: ">" for s in streams}, count=count, block=block_ms)
        # RESP2 (what the client speaks): [[stream, [(entry id, fields), ...]], ...]; None when nothing came in time
        return [(text(stream), _entries(entries)) for stream, entries in _array(replies)]

    def reclaim(self, stream: str, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]:
        """Entries other consumers left pending longer than min_idle_ms, now this consumer's, with their delivery counts."""
        # [the next id to scan from, [(entry id, fields), ...], the ids of entries deleted meanwhile]
        _, raw, _ = self.redis.xautoclaim(stream, self.group, consumer, min_idle_time=min_idle_ms, count=count)
        entries = _entries(raw)
        if not entries:
            return []
        pending = self.redis.xpending_range(
            stream,
            self.group,
            min=entries[0].entry_id,
            max=entries[-1].entry_id,
            count=len(entries),
            consumername=consumer,
        )
        counts = {_text(p["message_id"]): int(p["times_delivered"]) for p in pending}
        return [StreamEntry(e.entry_id, e.value, counts.get(e.entry_id, 0)) for e in entries]

    def ack(self, stream: str, entry_ids: list[str]) -> None:
        """Acknowledge and delete (the stream does not grow)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(stream, self.group, *entry_ids)
        pipe.xdel(stream, *entry_ids)
        pipe.execute()

    def dead_letter(self, dead_stream: str, entry: StreamEntry, error: str) -> None:
        self.redis.xadd(dead_stream, {"e": entry.value, "id": entry.entry_id, "error": error[:1024]})

    def dead_entries(self, dead_stream: str, count: int) -> list[DeadStreamEntry]:
        found = cast("list[tuple[bytes, dict[bytes, bytes]]]", self.redis.xrange(dead_stream, count=count))
        return [
            DeadStreamEntry(
                text(entry_id), text(fields.get(b"id")) or "", text(fields.get(b"error")) or "", fields.get(b"e", b"")
            )
            for entry_id, fields in found
        ]

    def revive(self, lua: Lua, shard: int, dead_entry_id: str) -> str | None:
        """A dead entry appended to its stream again (outbox_stream_revive.lua); None when it is not there."""
        revived = lua.run("outbox_stream_revive", [keys.dead_stream(shard), keys.stream(shard)], [dead_entry_id])
        return text(revived) if revived else None

    def forget_idle_consumers(self, streams: list[str], keep: str, idle_ms: int) -> int:
        """Drop the consumers idle longer than idle_ms with nothing pending (each drainer run is its own consumer)."""
        removed = 0
        for stream in streams:
            for consumer in self.redis.xinfo_consumers(stream, self.group):
                if consumer["pending"] == 0 and consumer["idle"] > idle_ms and text(consumer["name"]) != keep:
                    removed += self.redis.xgroup_delconsumer(stream, self.group, consumer["name"])
        return removed


def _array(reply: object) -> list[Any]:
    """An array reply over RESP2 (a list); None, an empty answer, as []."""
    if reply is None:
        return []
    if not isinstance(reply, list):
        raise TypeError(f"not an array reply (RESP2): {type(reply).__name__}")
    return reply


def _text(value: bytes | str | int) -> str:
    """A field of a reply's map as text (redis-py answers bytes, or an int where Redis gives a number)."""
    return value.decode() if isinstance(value, bytes) else str(value)
