"""App inbox (the seed's message center): per account, a zset index of message ids by creation time, one
string per message (expiring with INBOX_TTL_S), and a (biz_type, outer_biz_id) record that makes posting
idempotent. Reads pull what came after the client's last message id. Redis only, as in the seed: the
inbox is a notification channel, not a ledger."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from hotledger import errors, keys
from hotledger.dal.redis_store import text


@dataclass(frozen=True)
class Message:
    message_id: str
    biz_type: str
    outer_biz_id: str
    title: str
    content: str
    url: str | None
    created_at: int


class Inbox:
    def __init__(self, scripts, ids, ttl_s: int, max_messages: int, account_exists):
        self.scripts, self.redis, self.ids = scripts, scripts.client, ids
        self.ttl_s, self.max_messages, self.account_exists = ttl_s, max_messages, account_exists

    def post(self, account: int, biz_type: str, outer_biz_id: str, title: str, content: str,
             url: str | None = None) -> tuple[str, bool]:
        """(message id, True when written now / False when this business event was posted before)."""
        if not self.account_exists(account):
            raise errors.AccountNotFound(f"account {account} does not exist")
        message_id, created = str(self.ids.next_id()), int(time.time() * 1000)
        body = json.dumps({"message_id": message_id, "biz_type": biz_type, "outer_biz_id": outer_biz_id, "title": title,
                           "content": content, "url": url, "created_at": created}, separators=(",", ":"))
        status, first = self.scripts.inbox_post(
            keys=[keys.inbox_index(account), keys.inbox_message(account, message_id), keys.inbox_biz(account, biz_type, outer_biz_id)],
            args=[message_id, created, body, self.ttl_s, self.max_messages])
        return text(first), text(status) == "new"

    def pull(self, account: int, after: str | None, limit: int) -> list[Message]:
        ids = [text(i) for i in self.scripts.inbox_pull(keys=[keys.inbox_index(account)], args=[after or "", limit])]
        if not ids:
            return []
        bodies = self.redis.mget([keys.inbox_message(account, i) for i in ids])
        return [Message(**json.loads(body)) for body in bodies if body is not None]
