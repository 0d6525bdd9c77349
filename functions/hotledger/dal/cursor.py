"""Where each part of a scheduled run stopped, kept in Redis between runs. Losing it (a Redis loss) restarts a part
from its first item: work is repeated, never skipped."""
from __future__ import annotations

import redis

from hotledger import keys
from hotledger.dal.redis_store import redis_errors_translated


@redis_errors_translated
class Cursors:
    def __init__(self, client: redis.Redis):
        self.client = client

    def get(self, part: str) -> int:
        raw = self.client.get(keys.reconcile_cursor(part))
        return int(raw) if raw else 0

    def set(self, part: str, after: int) -> None:
        self.client.set(keys.reconcile_cursor(part), after)
