"""Where an account's currency is kept: t_account.currency (NULL: an account made before currencies, which holds the
currency DEFAULT_CURRENCY names), and a copy in Redis under the account's hash tag, so the hot path reads it without
the DB (a currency never changes: the copy never goes stale, and a lost one is read again from the DB)."""

from __future__ import annotations

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua, redis_errors_translated, text

_MISSING = "-"  # the DB has no such account


@redis_errors_translated
class CurrencyStore:
    def __init__(self, lua: Lua):
        self.redis = lua.client

    def cached(self, user_id: int) -> str | None:
        """The account's currency as Redis keeps it ('' for the default currency), or None when Redis has no copy."""
        raw = self.redis.get(keys.currency(user_id))
        return None if raw is None else text(raw)

    def cache(self, user_id: int, code: str) -> None:
        self.redis.set(keys.currency(user_id), code)

    def stored(self, user_id: int) -> str | None:
        """The account's currency in the DB ('' for NULL: the default), None when there is no such account."""
        rows = db.query("SELECT currency FROM t_account WHERE user_id = %s", (user_id,))
        if not rows:
            return None
        return rows[0][0] or ""
