"""The operators' console behind admin routes (`hotledger ops` / `make ops` calls them): what is stuck and where, one
account as Redis and the DB hold it, each reconciler part's last run, and replays of dead letters.

Dead letters come from five places, each named by a source:
- `writer`: records the writer set aside in t_dead_letter: undecodable or unverifiable records of the log (replayable:
  their bytes go back to the topic or stream they came from, the MAC is checked again, so a forged record is set aside
  again) and the persisters' refusals (final: the DB refused a verified change and Redis gave it back, so a replay
  could only repeat the refusal or, worse, apply what the user was told failed).
- `topic`: batches the writer's trigger gave up on, whole, on `<topic>.dead-letter`: replayed in order to the topic
  they came from, then marked resolved through the last one replayed (rebuilt vouchers and packets wait for that).
- `stream`: entries the Redis Streams consumer set aside (events:dead:{s<n>}): appended to their stream again.
- `webhook`: deliveries dead-lettered after 3 days of retries: sent again, in order, their endpoints unflagged.
- `delay`: delay queues' dead elements, counted here; listed and replayed by the delay-queue routes.

A writer or stream dead letter is replayable while the rollback records (t_rolled_back, pruned after
KEY_RETENTION_DAYS) can still judge it: its record was produced at most the log's retention (LOG_RETENTION_DAYS) before
it was set aside, and its rollback record, if any, no earlier; so it expires (listed `expired`, refused with
DEAD_LETTER_EXPIRED) KEY_RETENTION_DAYS - LOG_RETENTION_DAYS - 1 days after it was set aside (the day: the replayed
record's way back through the writer). Past that a replay could apply a change its client was told failed.

Every replay is idempotent and logged (t_ops_log: who, what, what came of it). Replaying a writer or topic record
twice can reach the writer twice; the writer applies each event once (by its id), so the second is a no-op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hotledger import errors, keys
from hotledger.dal import db
from hotledger.dal.topics import dead_letter_topic
from hotledger.ledger.service import expected_cache
from hotledger.ops.store import OpsLog, OpsLogLine

if TYPE_CHECKING:
    from hotledger.dal.cursor import Cursors
    from hotledger.dal.delay_queue import DelayQueue
    from hotledger.dal.publisher import LogRecord
    from hotledger.dal.redis_store import Lua
    from hotledger.ledger.store import LedgerStore
    from hotledger.outbox.store import DeadLetter, EventStreams, OutboxStore
    from hotledger.webhooks.service import Webhooks

log = logging.getLogger(__name__)

# the longest a record stays on the log before the writer reads it (MSK's default log.retention.hours, 168; the
# template sets no other): KEY_RETENTION_DAYS must stay above it (config.py)
LOG_RETENTION_DAYS = 7
REPLAY_MARGIN_DAYS = 1
SOURCES = ("writer", "topic", "stream", "webhook", "delay")
REPLAYABLE = ("writer", "topic", "stream", "webhook")


@dataclass
class ReplayOutcome:
    replayed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why it was not sent


@dataclass(frozen=True, kw_only=True)
class Transport:
    """How replayed bytes reach the writer again: the Kafka publisher's republish(topic, key, value) and read(topic,
    since, limit), or (EVENT_TRANSPORT=redis-stream) an XADD to the stream they came from."""

    streamed: bool
    topic: str
    republish: Callable[[str, bytes | None, bytes], None]
    read: Callable[[str, dict[int, int], int], list[LogRecord]]
    append_to_stream: Callable[[str, bytes], None]
    shards: int


class Operations:
    def __init__(
        self,
        *,
        outbox: OutboxStore,
        streams: EventStreams,
        webhooks: Webhooks,
        delay_queue: DelayQueue,
        delay_queues: Callable[[], list[str]],
        ledger_store: LedgerStore,
        cursors: Cursors,
        part_names: Callable[[], list[str]],
        transport: Transport,
        lua: Lua,
        ops_log: OpsLog,
        key_retention_ms: int = 30 * 86_400_000,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ):
        self.outbox, self.streams, self.webhooks, self.delay_queue = outbox, streams, webhooks, delay_queue
        self.delay_queues, self.ledger_store, self.cursors, self.part_names = (
            delay_queues,
            ledger_store,
            cursors,
            part_names,
        )
        self.transport, self.lua, self.ops_log, self.clock = transport, lua, ops_log, clock
        # how long after it was set aside a writer or stream dead letter can still be judged (the module's docstring)
        self.replayable_ms = key_retention_ms - (LOG_RETENTION_DAYS + REPLAY_MARGIN_DAYS) * 86_400_000

    def expired(self, set_aside_ms: int) -> bool:
        """Whether a dead letter set aside then is past what the rollback records can judge."""
        return self.clock() - set_aside_ms >= self.replayable_ms

    # looking -------------------------------------------------------------------------------------------------------
    def dead_letters(self, sources: tuple[str, ...], limit: int) -> dict[str, list[dict[str, Any]]]:
        listed: dict[str, list[dict[str, Any]]] = {}
        if "writer" in sources:
            listed["writer"] = [
                {**_writer_view(d), "expired": self.expired(db.to_ms(d.created_at))}
                for d in self.outbox.dead_letters(limit)
            ]
        if "topic" in sources:
            listed["topic"] = [] if self.transport.streamed else [_topic_view(r) for r in self._unresolved(limit)]
        if "stream" in sources:
            listed["stream"] = (
                []
                if not self.transport.streamed
                else [
                    {
                        "id": f"{shard}:{e.entry_id}",
                        "stream_entry_id": e.stream_entry_id,
                        "error": e.error,
                        "expired": self.expired(_entry_ms(e.entry_id)),
                    }
                    for shard in range(self.transport.shards)
                    for e in self.streams.dead_entries(keys.dead_stream(shard), limit)
                ][:limit]
            )
        if "webhook" in sources:
            listed["webhook"] = [
                {
                    "id": str(d.endpoint_id),
                    "endpoint_id": str(d.endpoint_id),
                    "event_id": d.event_id,
                    "type": d.type,
                    "user_id": d.user_id,
                    "seq": d.seq,
                    "attempts": d.attempts,
                    "last_status": d.last_status,
                    "last_error": d.last_error,
                }
                for d in self.webhooks.dead_letters(limit)
            ]
        if "delay" in sources:
            listed["delay"] = [{"queue": q, "dead": self.delay_queue.stats(q).dead} for q in self.delay_queues()]
        return listed

    def account(self, user_id: int) -> dict[str, Any]:
        """The account as the DB and Redis hold it now, its pending entries, and whether the cache is what the DB
        plus those entries make (a moment's view: a writer committing meanwhile can show a passing difference). A SYNC
        account's cache serves its mode alone (ledger.service _charge_in_db): Redis shows only that, and agrees."""
        account = self.ledger_store.account(user_id)
        if account is None:
            raise errors.AccountNotFound(f"account {user_id} does not exist")
        with self.ledger_store.transaction() as tx:
            expected, flag, pending, _ = expected_cache(tx, self.ledger_store, account)
        cached = self.ledger_store.cached(user_id)
        sync = account.deduct_type == "SYNC"
        return {
            "user_id": user_id,
            "db": {
                "balance": account.balance,
                "version": account.version,
                "seq": account.seq,
                "on_hold": account.on_hold,
                "mode": account.deduct_type,
                "open": account.open_flag,
            },
            "redis": None
            if cached is None
            else {"mode": "SYNC"}
            if sync
            else {
                "balance": cached.balance,
                "version": cached.version,
                "held": cached.held,
                "on_hold": cached.on_hold,
                "open": cached.open_flag,
            },
            "pending": [
                {
                    "entry_id": str(e.entry_id),
                    "kind": e.kind,
                    "amount": e.amount,
                    "delta": e.delta,
                    "charged_at": e.ts,
                    "version": e.version,
                }
                for e in pending
            ],
            "expected_balance": expected,
            "agrees": cached is None or sync or (cached.balance == expected and cached.open_flag == flag),
        }

    def reconciler(self) -> list[dict[str, Any]]:
        runs = self.cursors.last_runs()
        return [
            {"part": part, "cursor": self.cursors.get(part), "last_run": runs.get(part)} for part in self.part_names()
        ]

    def log(self, limit: int) -> list[OpsLogLine]:
        return self.ops_log.lines(limit)

    # replaying -----------------------------------------------------------------------------------------------------
    def replay(self, source: str, ids: list[str] | None, actor: str) -> ReplayOutcome:
        """Replay the source's dead letters (the ids given, or every one not replayed yet), then log it."""
        if source == "topic" and ids:
            raise errors.InvalidDeadLetterId("the dead-letter topic is replayed whole and in order: send no ids")
        outcome = {
            "writer": self._replay_writer,
            "topic": self._replay_topic,
            "stream": self._replay_stream,
            "webhook": self._replay_webhooks,
        }[source](ids)
        self.record(actor, f"replay.{source}", {"ids": ids, **asdict(outcome)})
        return outcome

    def record(self, actor: str, action: str, detail: dict[str, Any]) -> None:
        """An operator's action in the operators' log and the function's log."""
        self.ops_log.write(actor, action, detail, self.clock())
        log.warning("operator action", extra={"actor": actor, "action": action, "detail": detail})

    def record_once(self, subject: str, actor: str, action: str, detail: dict[str, Any]) -> dict[str, Any]:
        """An action a retry repeats (under its Idempotency-Key): one line about `subject`, whichever call writes it;
        answers the detail the line holds, the first call's."""
        logged, written = self.ops_log.write_once(subject, actor, action, detail, self.clock())
        if written:
            log.warning("operator action", extra={"actor": actor, "action": action, "detail": detail})
        return logged

    def _replay_writer(self, ids: list[str] | None) -> ReplayOutcome:
        outcome = ReplayOutcome()
        wanted = (
            self.outbox.dead_letters_by_id([_number(i) for i in ids])
            if ids
            else self.outbox.unreplayed_dead_letters(500)
        )
        for missing in set(ids or ()) - {str(d.dead_letter_id) for d in wanted}:
            outcome.skipped[missing] = "no such dead letter"
        expired = {
            d.dead_letter_id
            for d in wanted
            if not d.final and d.replayed_at is None and self.expired(db.to_ms(d.created_at))
        }
        if ids and expired:  # named: refused whole, the operator learns it before anything moved
            raise errors.DeadLetterExpired(
                f"dead letters {', '.join(str(i) for i in sorted(expired))} are older than the rollback records can"
                " judge: a replay could apply a change its client was told failed",
            )
        for d in wanted:
            if d.dead_letter_id in expired:
                outcome.skipped[str(d.dead_letter_id)] = _EXPIRED
            elif d.final:
                outcome.skipped[str(d.dead_letter_id)] = (
                    "final: the DB refused this verified change and it was given back"
                )
            elif d.replayed_at is not None:
                outcome.skipped[str(d.dead_letter_id)] = f"replayed already at {d.replayed_at}"
            elif d.value is None:
                outcome.skipped[str(d.dead_letter_id)] = "the record had no value"
            else:
                # sent, then marked: a crash in between sends it again next time, which the writer applies once
                if self.transport.streamed:
                    self.transport.append_to_stream(d.topic, d.value)
                else:
                    self.transport.republish(d.topic, d.key, d.value)
                self.outbox.mark_replayed(d.dead_letter_id, self.clock())
                outcome.replayed.append(str(d.dead_letter_id))
        return outcome

    def _unresolved(self, limit: int) -> list[LogRecord]:
        topic = dead_letter_topic(self.transport.topic)
        resolved = self.outbox.applied_offsets(topic)
        return self.transport.read(topic, {p: offset + 1 for p, offset in resolved.items()}, limit)

    def _replay_topic(self, _ids: list[str] | None) -> ReplayOutcome:
        outcome = ReplayOutcome()
        if self.transport.streamed:
            return outcome
        last: dict[int, int] = {}
        for record in self._unresolved(1000):
            self.transport.republish(
                record.headers.get("source-topic") or self.transport.topic, record.key, record.value
            )
            last[record.partition] = record.offset
            outcome.replayed.append(f"{record.partition}:{record.offset}")
        # resolved through the last one replayed: the next replay starts after it, rebuilt entities may sell again
        self.outbox.record_applied({(dead_letter_topic(self.transport.topic), p): offset for p, offset in last.items()})
        return outcome

    def _replay_stream(self, ids: list[str] | None) -> ReplayOutcome:
        outcome = ReplayOutcome()
        named = [_stream_id(i) for i in ids or ()]
        if not self.transport.streamed:
            return outcome
        wanted = named or [
            (shard, e.entry_id)
            for shard in range(self.transport.shards)
            for e in self.streams.dead_entries(keys.dead_stream(shard), 500)
        ]
        expired = [f"{shard}:{entry_id}" for shard, entry_id in wanted if self.expired(_entry_ms(entry_id))]
        if named and expired:  # named: refused whole, before anything moved
            raise errors.DeadLetterExpired(
                f"dead stream entries {', '.join(expired)} are older than the rollback records can judge: a replay"
                " could apply a change its client was told failed",
            )
        for shard, entry_id in wanted:
            if f"{shard}:{entry_id}" in expired:
                outcome.skipped[f"{shard}:{entry_id}"] = _EXPIRED
            elif shard >= self.transport.shards or self.streams.revive(self.lua, shard, entry_id) is None:
                outcome.skipped[f"{shard}:{entry_id}"] = "not a dead entry (replayed already, or no such entry)"
            else:
                outcome.replayed.append(f"{shard}:{entry_id}")
        return outcome

    def _replay_webhooks(self, ids: list[str] | None) -> ReplayOutcome:
        outcome = ReplayOutcome()
        for endpoint in [_number(i) for i in ids] if ids else [None]:
            revived = self.webhooks.replay_dead(endpoint)
            name = "every endpoint" if endpoint is None else str(endpoint)
            if revived:
                outcome.replayed.append(f"{name}: {revived} deliveries")
            else:
                outcome.skipped[name] = "no dead-lettered deliveries"
        return outcome


_EXPIRED = "DEAD_LETTER_EXPIRED: older than the rollback records can judge (a change its client was told failed)"


def _number(dead_letter_id: str) -> int:
    if not dead_letter_id.isdigit() or not 0 < int(dead_letter_id) < 2**63:
        raise errors.InvalidDeadLetterId(f"{dead_letter_id!r} is not a dead letter's id (a positive number)")
    return int(dead_letter_id)


def _stream_id(dead_letter_id: str) -> tuple[int, str]:
    shard, _, entry_id = dead_letter_id.partition(":")
    millis, _, seq = entry_id.partition("-")
    if not (shard.isdigit() and millis.isdigit() and seq.isdigit()):
        raise errors.InvalidDeadLetterId(f"{dead_letter_id!r} is not a dead stream entry's id (<shard>:<ms>-<seq>)")
    return int(shard), entry_id


def _entry_ms(entry_id: str) -> int:
    """When a stream entry was added: its id's first part ('<ms>-<seq>')."""
    return int(entry_id.partition("-")[0])


def _writer_view(d: DeadLetter) -> dict[str, Any]:
    return {
        "id": str(d.dead_letter_id),
        "topic": d.topic,
        "partition": d.partition,
        "offset": d.offset,
        "key": (d.key or b"").decode(errors="replace"),
        "error": d.error,
        "created_at": db.to_ms(d.created_at),
        "replayed_at": d.replayed_at,
        "final": d.final,
    }


def _topic_view(r: LogRecord) -> dict[str, Any]:
    return {
        "id": f"{r.partition}:{r.offset}",
        "partition": r.partition,
        "offset": r.offset,
        "source_topic": r.headers.get("source-topic"),
        "source_partition": r.headers.get("source-partition"),
        "source_offset": r.headers.get("source-offset"),
        "reason": r.headers.get("failure-reason"),
    }
