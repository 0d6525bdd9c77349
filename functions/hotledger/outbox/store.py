"""The outbox's storage: the fate claim every persister takes before its commit (outbox_claim.lua) and the
dead-letter table."""
from __future__ import annotations

from hotledger.dal.redis_store import Lua
from hotledger.outbox.events import PoisonRecord


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
