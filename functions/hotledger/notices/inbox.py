"""App inbox (the seed's message center): per account, messages indexed by creation time, each expiring with
INBOX_TTL_S, and posting idempotent per (biz_type, outer_biz_id): a second post of one business event writes
nothing and answers the first message's id. The index keeps at most INBOX_MAX_MESSAGES. Reads pull what came
after the client's last message id. Redis only, as in the seed: the inbox is a notification channel, not a
ledger."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, NamedTuple

from hotledger import errors
from hotledger.notices.store import InboxStore, PostStatus

if TYPE_CHECKING:
    from hotledger.dal.ids import IdGenerator


@dataclass(frozen=True)
class Message:
    message_id: str
    biz_type: str
    outer_biz_id: str
    title: str
    content: str
    url: str | None
    created_at: int


class Posted(NamedTuple):
    message_id: str  # the message written now, or the one written first for this business event
    new: bool  # False: this business event was posted before


def _now_ms() -> int:
    return int(time.time() * 1000)


class Inbox:
    def __init__(
        self,
        store: InboxStore,
        ids: IdGenerator,
        ttl_s: int,
        max_messages: int,
        account_exists: Callable[[int], bool],
        now_ms: Callable[[], int] = _now_ms,
    ):
        self.store, self.ids = store, ids
        self.ttl_s, self.max_messages, self.account_exists, self.now_ms = ttl_s, max_messages, account_exists, now_ms

    def post(
        self, account: int, biz_type: str, outer_biz_id: str, title: str, content: str, url: str | None = None
    ) -> Posted:
        if not self.account_exists(account):
            raise errors.AccountNotFound(f"account {account} does not exist")
        message = Message(str(self.ids.next_id()), biz_type, outer_biz_id, title, content, url, self.now_ms())
        reply = self.store.post(
            account,
            biz_type,
            outer_biz_id,
            message.message_id,
            message.created_at,
            json.dumps(asdict(message), separators=(",", ":")),
            self.ttl_s,
            self.max_messages,
        )
        return Posted(reply.message_id, reply.status is PostStatus.NEW)

    def pull(self, account: int, after: str | None, limit: int) -> list[Message]:
        return [Message(**json.loads(body)) for body in self.store.pull(account, after, limit)]
