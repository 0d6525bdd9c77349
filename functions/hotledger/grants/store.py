"""Credit grants' storage: the typed wrapper of ledger_grant_expire.lua (the account's grants in Redis are kept by
layers/lua/lib/grants.lua; keys.grants, keys.grant_expiry)."""

from __future__ import annotations

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua
from hotledger.grants.replies import ExpireReply
from hotledger.grants.rows import ACTIVE


class GrantStore:
    def __init__(self, lua: Lua, stream_flag: str, entry_ttl_s: int):
        self.lua, self.stream_flag, self.entry_ttl_s = lua, stream_flag, entry_ttl_s

    def expire(self, user_id: int, grant_id: int, entry_id: int, ts: int) -> ExpireReply:
        """ledger_grant_expire.lua: end the grant at its expires_at (an expiry entry takes what is left of it)."""
        return ExpireReply.parse(
            self.lua.run(
                "ledger_grant_expire",
                [
                    keys.balance(user_id),
                    keys.entry(user_id, entry_id),
                    keys.pending(user_id),
                    keys.grants(user_id),
                    keys.grant_expiry(user_id),
                    keys.held(user_id),
                    keys.account_stream(user_id),
                ],
                [grant_id, entry_id, ts, self.entry_ttl_s, self.stream_flag, user_id],
            )
        )

    @staticmethod
    def due_in_db(before_ms: int, after_id: int, limit: int) -> list[tuple[int, int]]:
        with db.transaction() as cur:
            cur.execute(
                "SELECT user_id, id FROM t_grant WHERE state = %s AND remaining > 0 AND expires_at < %s AND id > %s"
                " ORDER BY id LIMIT %s",
                (ACTIVE, before_ms, after_id, limit),
            )
            return [(row[0], row[1]) for row in cur.fetchall()]
