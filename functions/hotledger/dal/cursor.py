"""What each part of a scheduled run leaves for the next one and for operators, kept in Redis between runs: where it
stopped (its cursor; the next run continues after it) and its last run (when, how long, whether it failed, what it
found). Losing them (a Redis loss) restarts a part from its first item, work repeated, never skipped, and empties the
console's view of past runs until the next one."""

from __future__ import annotations

import json
from typing import Any

import redis

from hotledger import keys
from hotledger.dal.redis_store import redis_errors_translated, text


@redis_errors_translated
class Cursors:
    def __init__(self, client: redis.Redis | redis.RedisCluster):
        self.client = client

    def get(self, part: str) -> int:
        raw = self.client.get(keys.reconcile_cursor(part))
        return int(raw) if raw else 0

    def set(self, part: str, after: int) -> None:
        self.client.set(keys.reconcile_cursor(part), after)

    def record_run(self, part: str, run: dict[str, Any]) -> None:
        """The part's last run: {at_ms, seconds, failed, findings} (JSON), replacing the one before."""
        self.client.hset(keys.reconcile_runs(), part, json.dumps(run, separators=(",", ":"), default=str))

    def last_runs(self) -> dict[str, dict[str, Any]]:
        """Each part's last run, as record_run wrote it (a JSON object)."""
        return {text(part): json.loads(raw) for part, raw in self.client.hgetall(keys.reconcile_runs()).items()}
