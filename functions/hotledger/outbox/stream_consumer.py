"""Redis Streams transport, consumer side (EVENT_TRANSPORT=redis-stream).

The Lua scripts XADD their events to events:{s<n>} atomically with the change. A consumer group reads
them with XREADGROUP COUNT/BLOCK, the same Writer persists them, and XACK (+ XDEL, so the stream does
not grow) follows the DB commit. A consumer that dies after reading leaves its entries pending; any
consumer reclaims entries idle longer than STREAM_CLAIM_IDLE_MS (XAUTOCLAIM) and retries them, and
persisting is idempotent, so a retry changes nothing twice. An entry delivered more than
STREAM_MAX_DELIVERIES times is retried alone, and moved to events:dead:{s<n>} only if it fails alone
for a reason other than an unavailable DB or Redis (an outage must not dead-letter good events).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from hotledger import keys
from hotledger.config import Settings
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.redis_store import RedisUnavailable, text
from hotledger.outbox.events import RawRecord, decode
from hotledger.outbox.writer import Writer

TRANSIENT = (redis.RedisError, RedisUnavailable, DatabaseUnavailable)
log = logging.getLogger(__name__)


@dataclass
class DrainReport:
    read: int = 0
    reclaimed: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    batches: int = 0


def stream_records(stream: str, shard: int, entries) -> list[RawRecord]:
    """Stream entries as records: the entry id 'ms-seq' becomes the offset ms * 1000 + seq."""
    records = []
    for entry_id, fields in entries:
        millis, seq = text(entry_id).split("-")
        records.append(RawRecord(stream, shard, int(millis) * 1000 + int(seq), None, fields.get(b"e", b"")))
    return records


class StreamConsumer:
    def __init__(self, client: redis.Redis, writer: Writer, cfg: Settings, name: str):
        self.redis, self.writer, self.cfg, self.name = client, writer, cfg, name
        self.streams = [keys.stream(shard) for shard in range(cfg.stream_shards)]
        self._groups_ready = False

    def ensure_groups(self) -> None:
        for stream in self.streams:
            try:
                self.redis.xgroup_create(stream, self.cfg.stream_group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True

    def drain(self, keep_going) -> DrainReport:
        """Read, persist and acknowledge until keep_going() is false. Starts with what dead consumers left."""
        report = DrainReport()
        while keep_going():
            try:
                if not self._groups_ready:
                    self.ensure_groups()
                self._reclaim(report)
                self._read_new(report)
            except TRANSIENT:  # entries stay pending and are retried; back off a little
                self._groups_ready = False
                time.sleep(0.5)
            except Exception:  # noqa: BLE001 - a batch that fails stays pending: reclaimed, retried, isolated if it keeps failing
                log.exception("stream batch failed; its entries stay pending")
                time.sleep(0.1)
        return report

    def _read_new(self, report: DrainReport) -> None:
        replies = self.redis.xreadgroup(self.cfg.stream_group, self.name, {s: ">" for s in self.streams},
                                        count=self.cfg.stream_batch, block=self.cfg.stream_block_ms)
        for stream, entries in replies or []:
            report.read += len(entries)
            self._persist(text(stream), entries, report)

    def _reclaim(self, report: DrainReport) -> None:
        for stream in self.streams:
            _, entries, _ = self.redis.xautoclaim(stream, self.cfg.stream_group, self.name,
                                                  min_idle_time=self.cfg.stream_claim_idle_ms, count=self.cfg.stream_batch)
            entries = [e for e in entries if e[1] is not None]  # deleted while pending: nothing to retry
            if not entries:
                continue
            report.reclaimed += len(entries)
            counts = {text(p["message_id"]): p["times_delivered"] for p in self.redis.xpending_range(
                stream, self.cfg.stream_group, min=text(entries[0][0]), max=text(entries[-1][0]), count=len(entries),
                consumername=self.name)}
            worn = [e for e in entries if counts.get(text(e[0]), 0) > self.cfg.stream_max_deliveries]
            fresh = [e for e in entries if e not in worn]
            if fresh:
                self._persist(stream, fresh, report)
            for entry in worn:
                self._persist_alone(stream, entry, report)

    def _persist(self, stream: str, entries, report: DrainReport) -> None:
        shard = self.streams.index(stream)
        events, poison = decode(stream_records(stream, shard, entries))
        result = self.writer.persist(events, poison)
        self._ack(stream, [e[0] for e in entries])
        report.batches += 1
        report.applied += result.applied
        report.duplicates += result.duplicates
        report.dead_lettered += result.dead_lettered

    def _persist_alone(self, stream: str, entry, report: DrainReport) -> None:
        try:
            self._persist(stream, [entry], report)
        except TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever makes this one entry fail, it must not block the rest
            shard = self.streams.index(stream)
            self.redis.xadd(keys.dead_stream(shard), {"e": entry[1].get(b"e", b""), "id": entry[0], "error": str(exc)[:1024]})
            self._ack(stream, [entry[0]])
            report.dead_lettered += 1

    def _ack(self, stream: str, ids) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(stream, self.cfg.stream_group, *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()

    def forget_idle_consumers(self, idle_ms: int = 600_000) -> int:
        """Each drainer run is its own consumer: drop those long idle with nothing pending."""
        removed = 0
        for stream in self.streams:
            for consumer in self.redis.xinfo_consumers(stream, self.cfg.stream_group):
                if consumer["pending"] == 0 and consumer["idle"] > idle_ms and text(consumer["name"]) != self.name:
                    removed += self.redis.xgroup_delconsumer(stream, self.cfg.stream_group, consumer["name"])
        return removed
