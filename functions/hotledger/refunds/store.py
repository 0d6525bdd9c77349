"""The refunds' storage: the typed wrapper of ledger_refund.lua and the SQL of t_refund."""

from __future__ import annotations

from hotledger import keys
from hotledger.dal import db
from hotledger.dal.redis_store import Lua
from hotledger.grants.tx import charge_spends_read
from hotledger.refunds.replies import RefundReply
from hotledger.refunds.rows import Refund


class RefundStore:
    def __init__(self, lua: Lua, stream_flag: str, entry_ttl_s: int, max_balance: int):
        self.lua, self.redis = lua, lua.client
        self.stream_flag, self.entry_ttl_s, self.max_balance = stream_flag, entry_ttl_s, max_balance

    def refund(
        self,
        user_id: int,
        refund_id: int,
        amount: int,
        ts: int,
        charge_id: int,
        charge_kind: str,
        charged: int,
        known_refunded: int | None,
        reason: str,
        spent: str,
    ) -> RefundReply:
        """spent: what the charge spent of the account's grants, '<grant id>:<spent>,...' in spend order."""
        return RefundReply.parse(
            self.lua.run(
                "ledger_refund",
                [
                    keys.balance(user_id),
                    keys.entry(user_id, refund_id),
                    keys.pending(user_id),
                    keys.refunds(user_id),
                    keys.held(user_id),
                    keys.account_stream(user_id),
                    keys.grants(user_id),
                    keys.grant_expiry(user_id),
                ],
                [
                    amount,
                    ts,
                    refund_id,
                    self.entry_ttl_s,
                    self.stream_flag,
                    user_id,
                    charge_id,
                    charge_kind,
                    charged,
                    "" if known_refunded is None else known_refunded,
                    self.max_balance,
                    reason,
                    spent,
                ],
            )
        )

    @staticmethod
    def booked_deduct(user_id: int, order_id: int) -> tuple[int, str | None] | None:
        """(amount, stored Idempotency-Key) of the account's deduct as the books hold it; None when they do not."""
        rows = db.query("SELECT amount, idem_key FROM t_order WHERE id = %s AND user_id = %s", (order_id, user_id))
        return (int(rows[0][0]), rows[0][1]) if rows else None

    @staticmethod
    def charge_spends(charge_kind: str, charge_id: int) -> list[tuple[int, int]] | None:
        """What the charge spent of its account's grants, in spend order (grants.tx.charge_spends_read); None while a
        grant it spent is not booked."""
        rows = db.query(*charge_spends_read(charge_kind, charge_id))
        if any(grant is None for _, _, grant in rows):
            return None
        return [(int(g), int(a)) for g, a, _ in rows]

    def refunded_in_db(self, charge_id: int) -> tuple[int, set[int]]:
        """(the charge's refunded total the DB holds, the ids of those refunds)."""
        rows = db.query("SELECT id, amount FROM t_refund WHERE charge_id = %s", (charge_id,))
        return sum(amount for _, amount in rows), {refund_id for refund_id, _ in rows}

    def stored(self, user_id: int, refund_id: int) -> Refund | None:
        rows = db.query(
            "SELECT id, user_id, charge_id, charge_kind, amount FROM t_refund WHERE id = %s AND user_id = %s",
            (refund_id, user_id),
        )
        if not rows:
            return None
        refund_id, owner, charge_id, charge_kind, amount = rows[0]
        return Refund(refund_id, owner, charge_id, charge_kind, amount, None)
