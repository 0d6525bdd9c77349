"""The hold of a voucher, red packet or account that Redis lost and that was rebuilt from the DB (issue 10, item 7).
An account holds only charges under Idempotency-Keys neither Redis nor the DB knows (ledger/service.py).

Orders and claims acknowledged before the loss may still be on their way to the DB: selling the rebuilt stock or
handing out the rebuilt items before they land would resell a unit (the DB then refuses an order after its 200)
or give an item to a second grabber (the first one's claim refused after its 200). So a rebuild holds the entity
(RECOVERING) until the writer has applied everything the log held when the rebuild happened:

- the rebuild marks the entity's hash: hold_until (REBUILD_HOLD_S, at least PUBLISH_TIMEOUT_S: a publish in flight
  at the loss is acknowledged within it, or rolled back) and hold_log = 'await';
- after hold_until, the scripts answer the first request of each HOLD_CHECK second 'held' (the others RECOVERING
  from the time hold it moves on), and that request calls passed(): the first such call reads where the log
  ends (every partition's end offset, stored in hold_log), each one compares that with the writer's watermark
  (t_log_watermark, recorded after each batch it applied whole), and the one that sees it reached lifts the hold
  (compare-and-set: a hold started by a later loss stays).

A batch the writer function kept failing on is sent whole, past the trigger's retries, to `<topic>.dead-letter` (the
template's on-failure destination), and the batches after it move the watermark past it. So a rebuilt entity also
stays RECOVERING while the dead-letter topic holds a record an operator has not resolved yet (replayed, then marked
resolved: `resolve_dead_letters`, recorded as that topic's watermark): any entity, not only the dead letter's own,
as a dead letter is read only to be replayed. docs/guarantees.md says so.

A cache miss is not always a loss (an eviction, a new node, an account imported into the DB), and a loss need not
have left anything of the entity in flight. So an account's rebuild (rebuild_hold) holds only while something of its
own may still be on its way to the DB (issue 31, hole 8): a record keyed by it past the writer's watermark (the hold
then lasts until the writer applied that record), or a publish in flight when its Redis node restarted empty (a node
younger than REBUILD_HOLD_S: the time hold, then the log as it is then). An account with nothing of its own in the
log answers at once. A failover does not start the promoted node anew: it takes at least the cluster's node
timeout, longer than PUBLISH_TIMEOUT_S (docs/guarantees.md), so every publish in flight at the loss has landed
in the log, or failed, before the new master answers.

With the Redis Streams transport there is no log outside Redis: a change and its event are written by one script
to one slot, so whatever a loss keeps is a consistent prefix; an entity Redis no longer holds has no event left
in the stream either. Its rebuild keeps the time hold only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hotledger.dal.publisher import LogRecord, LogUnreadable
from hotledger.dal.publisher import read as read_log
from hotledger.dal.topics import dead_letter_topic
from hotledger.outbox.store import OutboxStore

AWAITING = "await"  # the rebuild's end of the log is not read yet
HOLD_CHECK_MS = 1000  # the scripts answer one caller a second 'held', moving the time hold on by this (their now + 1 s)
# a rebuild reads at most this many records past the writer's watermark looking for its entity's: a writer further
# behind holds the entity until it caught up, as a rebuild did before (reading more would slow every cache miss)
SCAN_LIMIT = 5000


def _encode(ends: dict[int, int]) -> str:
    # never '': an empty log still needs a value that is not "no hold"
    return ",".join(f"{partition}:{end}" for partition, end in sorted(ends.items())) or "-"


def _decode(held: str) -> dict[int, int]:
    return {int(p): int(end) for p, end in (pair.split(":") for pair in held.split(",") if ":" in pair)}


class LogHold:
    def __init__(
        self,
        outbox: OutboxStore,
        end_offsets: Callable[[str], dict[int, int]],
        topic: str,
        streamed: bool,
        read: Callable[..., list[LogRecord]] = read_log,
    ):
        """end_offsets(topic): partition -> where that topic's log ends (dal/publisher.end_offsets); read: its records
        (dal/publisher.read)."""
        self.outbox, self.end_offsets, self.topic, self.read = outbox, end_offsets, topic, read
        self.enabled = not streamed
        self._log_end: tuple[int, dict[int, int]] | None = None  # (epoch ms before the read, where the log ended)

    def rebuild_mark(self) -> str:
        """The hold_log a rebuild starts with ('': none, the Redis Streams transport)."""
        return AWAITING if self.enabled else ""

    def rebuild_hold(self, record_key: str, node_started_at: int, hold_ms: int, now_ms: int) -> tuple[int, str]:
        """(hold_until, hold_log) of an entity loaded from the DB whose records the log keys by `record_key`, on a Redis
        node started at `node_started_at` (epoch ms): (0, '') when nothing of its own can be on its way to the DB."""
        if not self.enabled:
            return 0, ""
        if now_ms < node_started_at + hold_ms:  # a publish in flight at the restart may land yet: wait, then the log
            return node_started_at + hold_ms, AWAITING
        try:
            unapplied = self._unapplied_of(record_key.encode())
        except LogUnreadable:
            unapplied = None
        if unapplied is None:  # cannot tell: the whole log as it is now, checked from the first caller on
            return now_ms, AWAITING
        return (now_ms, _encode(unapplied)) if unapplied else (0, "")

    def _unapplied_of(self, key: bytes) -> dict[int, int] | None:
        """partition -> the offset past the last record keyed `key` the writer has not applied ({}: none). None when
        it cannot tell: more than SCAN_LIMIT records to read, or an unresolved dead letter (which may be its)."""
        applied = self.outbox.applied_offsets(self.topic)
        ends = self.end_offsets(self.topic)
        since = {p: applied.get(p, -1) + 1 for p, end in ends.items() if applied.get(p, -1) + 1 < end}
        if sum(ends[p] - start for p, start in since.items()) > SCAN_LIMIT or self.unresolved_dead_letters():
            return None
        if not since:
            return {}
        found: dict[int, int] = {}
        for record in self.read(self.topic, since, SCAN_LIMIT, until={p: ends[p] for p in since}):
            if record.key == key:
                found[record.partition] = max(found.get(record.partition, 0), record.offset + 1)
        return found

    def passed(self, hold_key: str, time_hold_over_at: int | None = None) -> bool:
        """Has the writer applied everything the log held when the rebuild of this hash's entity happened? Lifts
        the hold when it has. False when not yet, or when the broker cannot tell where its log ends.
        `time_hold_over_at` (epoch ms, at or after the end of the entity's time hold): where the log ends may be taken
        from this process's last read if it started no sooner (after a Redis loss, every account touched is
        rebuilt, and each would read the whole topic's ends); None: read it now."""
        held = self.outbox.log_hold(hold_key)
        if held == AWAITING:
            try:
                ends = self._log_ends(time_hold_over_at)
            except LogUnreadable:
                return False
            held = self.outbox.swap_log_hold(hold_key, AWAITING, _encode(ends))
        if not held:
            return True  # lifted meanwhile
        applied = self.outbox.applied_offsets(self.topic)
        if any(applied.get(partition, -1) < end - 1 for partition, end in _decode(held).items()):
            return False
        if self.unresolved_dead_letters():
            return False
        return self.outbox.swap_log_hold(hold_key, held, "") == ""

    def _log_ends(self, read_since: int | None) -> dict[int, int]:
        last = self._log_end
        if read_since is None or last is None or last[0] < read_since:
            started = int(time.time() * 1000)
            last = self._log_end = (started, self.end_offsets(self.topic))
        return last[1]

    def unresolved_dead_letters(self) -> bool:
        """Does the dead-letter topic hold records past what an operator resolved? True when it cannot be read."""
        topic = dead_letter_topic(self.topic)
        try:
            ends = self.end_offsets(topic)
        except LogUnreadable:
            return True
        resolved = self.outbox.applied_offsets(topic)
        return any(resolved.get(partition, -1) < end - 1 for partition, end in ends.items() if end > 0)

    def resolve_dead_letters(self) -> dict[int, int]:
        """An operator replayed every dead letter the topic holds now (or judged it needs none): mark them resolved, so
        rebuilt entities may sell again. Returns partition -> the end now resolved."""
        ends = self.end_offsets(dead_letter_topic(self.topic))
        self.outbox.record_applied({(dead_letter_topic(self.topic), p): end - 1 for p, end in ends.items() if end > 0})
        return ends
