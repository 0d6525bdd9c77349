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
from collections.abc import Callable
from dataclasses import dataclass

from hotledger import keys
from hotledger.config import Settings
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.outbox.events import RawRecord, decode
from hotledger.outbox.store import EventStreams, StreamEntry
from hotledger.outbox.writer import Writer

TRANSIENT = (RedisUnavailable, DatabaseUnavailable)
log = logging.getLogger(__name__)


@dataclass
class DrainReport:
    read: int = 0
    reclaimed: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    batches: int = 0


class StreamConsumer:
    def __init__(self, streams: EventStreams, writer: Writer, cfg: Settings, name: str):
        self.events, self.writer, self.cfg, self.name = streams, writer, cfg, name
        self.streams = [keys.stream(shard) for shard in range(cfg.stream_shards)]
        self._groups_ready = False

    def ensure_groups(self) -> None:
        self.events.ensure_groups(self.streams)
        self._groups_ready = True

    def drain(self, keep_going: Callable[[], bool]) -> DrainReport:
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
            except Exception:
                log.exception("stream batch failed; its entries stay pending")
                time.sleep(0.1)
        return report

    def _read_new(self, report: DrainReport) -> None:
        for stream, entries in self.events.read_new(
            self.name, self.streams, self.cfg.stream_batch, self.cfg.stream_block_ms
        ):
            report.read += len(entries)
            if entries:
                self._persist(stream, entries, report)

    def _reclaim(self, report: DrainReport) -> None:
        for stream in self.streams:
            entries = self.events.reclaim(stream, self.name, self.cfg.stream_claim_idle_ms, self.cfg.stream_batch)
            if not entries:
                continue
            report.reclaimed += len(entries)
            worn = [e for e in entries if e.deliveries > self.cfg.stream_max_deliveries]
            fresh = [e for e in entries if e.deliveries <= self.cfg.stream_max_deliveries]
            if fresh:
                self._persist(stream, fresh, report)
            for entry in worn:
                self._persist_alone(stream, entry, report)

    def _persist(self, stream: str, entries: list[StreamEntry], report: DrainReport) -> None:
        shard = self.streams.index(stream)
        # unsigned: the scripts XADD these inside the trusted Redis (see outbox/events.py)
        events, poison = decode((RawRecord(stream, shard, e.offset, None, e.value) for e in entries), None)
        result = self.writer.persist(events, poison)
        self.events.ack(stream, [e.entry_id for e in entries])
        report.batches += 1
        report.applied += result.applied
        report.duplicates += result.duplicates
        report.dead_lettered += result.dead_lettered

    def _persist_alone(self, stream: str, entry: StreamEntry, report: DrainReport) -> None:
        try:
            self._persist(stream, [entry], report)
        except TRANSIENT:
            raise
        except Exception as exc:
            self.events.dead_letter(keys.dead_stream(self.streams.index(stream)), entry, str(exc))
            self.events.ack(stream, [entry.entry_id])
            report.dead_lettered += 1

    def forget_idle_consumers(self, idle_ms: int = 600_000) -> int:
        """Each drainer run is its own consumer: drop those long idle with nothing pending."""
        return self.events.forget_idle_consumers(self.streams, self.name, idle_ms)
