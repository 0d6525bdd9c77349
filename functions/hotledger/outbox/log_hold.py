"""The hold of a voucher or red packet that Redis lost and that was rebuilt from the DB (issue 10, item 7).

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

With the Redis Streams transport there is no log outside Redis: a change and its event are written by one script
to one slot, so whatever a loss keeps is a consistent prefix; an entity Redis no longer holds has no event left
in the stream either. Its rebuild keeps the time hold only.
"""
from __future__ import annotations

from collections.abc import Callable

from hotledger.dal.publisher import LogUnreadable
from hotledger.outbox.store import OutboxStore

AWAITING = "await"  # the rebuild's end of the log is not read yet


def _encode(ends: dict[int, int]) -> str:
    # never '': an empty log still needs a value that is not "no hold"
    return ",".join(f"{partition}:{end}" for partition, end in sorted(ends.items())) or "-"


def _decode(held: str) -> dict[int, int]:
    return {int(p): int(end) for p, end in (pair.split(":") for pair in held.split(",") if ":" in pair)}


class LogHold:
    def __init__(self, outbox: OutboxStore, end_offsets: Callable[[], dict[int, int]], topic: str, streamed: bool):
        self.outbox, self.end_offsets, self.topic = outbox, end_offsets, topic
        self.enabled = not streamed

    def rebuild_mark(self) -> str:
        """The hold_log a rebuild starts with ('': none, the Redis Streams transport)."""
        return AWAITING if self.enabled else ""

    def passed(self, hold_key: str) -> bool:
        """Has the writer applied everything the log held when the rebuild of this hash's entity happened? Lifts
        the hold when it has. False when not yet, or when the broker cannot tell where its log ends."""
        held = self.outbox.log_hold(hold_key)
        if held == AWAITING:
            try:
                ends = self.end_offsets()
            except LogUnreadable:
                return False
            held = self.outbox.swap_log_hold(hold_key, AWAITING, _encode(ends))
        if not held:
            return True  # lifted meanwhile
        applied = self.outbox.applied_offsets(self.topic)
        if any(applied.get(partition, -1) < end - 1 for partition, end in _decode(held).items()):
            return False
        return self.outbox.swap_log_hold(hold_key, held, "") == ""
