"""Transfers' storage: t_transfer, and the look-ups of their legs in the ledger's books (t_order: the payer's debit,
t_pay: the payee's credit and the payer's release, each under the transfer's own Idempotency-Key)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hotledger.dal import db
from hotledger.ledger.entry import ServiceKey
from hotledger.transfers.rows import Transfer

_COLUMNS = (
    "id, from_id, to_id, amount, currency, description, state, debit_id, credit_id, release_id, failure, created_at,"
    " updated_at"
)


def debit_key(transfer_id: int) -> ServiceKey:
    """The payer's debit, kind T (history type transfer_debit, ref transfer:<id>: ledger/book.py)."""
    return ServiceKey(f"transferdebit{transfer_id}")


def credit_key(transfer_id: int) -> ServiceKey:
    """The payee's recharge (transfer_credit)."""
    return ServiceKey(f"transfercredit{transfer_id}")


def release_key(transfer_id: int) -> ServiceKey:
    """The payer's recharge giving back the debit of a transfer whose credit was refused for good (transfer_release)."""
    return ServiceKey(f"transferrelease{transfer_id}")


def _transfer(row: Sequence[Any]) -> Transfer:
    return Transfer(*row)


class TransferStore:
    @staticmethod
    def insert(t: Transfer) -> bool:
        """The transfer as PENDING; False when one with this id is there already (another attempt under the same
        Idempotency-Key inserted it)."""
        affected = db.execute(
            "INSERT INTO t_transfer (id, from_id, to_id, amount, currency, description, state, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, 'PENDING', %s, %s) ON DUPLICATE KEY UPDATE id = id",
            (t.transfer_id, t.from_id, t.to_id, t.amount, t.currency, t.description, t.created_at, t.created_at),
        )
        return affected == 1

    @staticmethod
    def get(transfer_id: int) -> Transfer | None:
        rows = db.query(f"SELECT {_COLUMNS} FROM t_transfer WHERE id = %s", (transfer_id,))
        return _transfer(rows[0]) if rows else None

    @staticmethod
    def move(transfer_id: int, was: str, to: str, now_ms: int, **fields: object) -> bool:
        """was -> to, with the fields given (debit_id, credit_id, release_id, failure); False when the transfer is not
        in `was` any more (another attempt moved it)."""
        sets = "".join(f", {name} = %s" for name in fields)
        return (
            db.execute(
                f"UPDATE t_transfer SET state = %s, updated_at = %s{sets} WHERE id = %s AND state = %s",
                (to, now_ms, *fields.values(), transfer_id, was),
            )
            == 1
        )

    @staticmethod
    def discard(transfer_id: int) -> None:
        """A PENDING transfer whose first debit was not made, for a cause that may pass: gone (its key may retry)."""
        db.execute("DELETE FROM t_transfer WHERE id = %s AND state = 'PENDING'", (transfer_id,))

    @staticmethod
    def in_state(state: str, updated_before: int, limit: int) -> list[Transfer]:
        return [
            _transfer(r)
            for r in db.query(
                f"SELECT {_COLUMNS} FROM t_transfer WHERE state = %s AND updated_at < %s ORDER BY updated_at LIMIT %s",
                (state, updated_before, limit),
            )
        ]

    @staticmethod
    def failed_with_debit(limit: int) -> list[Transfer]:
        """FAILED transfers never released whose payer holds the debit after all (an attempt that stalled past the
        refusal the transfer failed on, then charged: its deduct is in t_order under debit_key)."""
        return [
            _transfer(r)
            for r in db.query(
                f"SELECT {', '.join('t.' + c.strip() for c in _COLUMNS.split(','))} FROM t_transfer t JOIN t_order o"
                " ON o.idem_key = CONCAT('transferdebit', t.id) AND o.user_id = t.from_id"
                " WHERE t.state = 'FAILED' AND t.release_id IS NULL LIMIT %s",
                (limit,),
            )
        ]

    @staticmethod
    def booked(t: Transfer) -> bool:
        """Both legs are in the ledger's books: the payer's deduct in t_order and the payee's recharge in t_pay (the
        writer books each with its t_entry row in one transaction)."""
        debit = db.query(
            "SELECT 1 FROM t_order WHERE idem_key = %s AND user_id = %s", (debit_key(t.transfer_id), t.from_id)
        )
        credit = db.query(
            "SELECT 1 FROM t_pay WHERE idem_key = %s AND user_id = %s", (credit_key(t.transfer_id), t.to_id)
        )
        return bool(debit) and bool(credit)

    @staticmethod
    def in_flight() -> int:
        """What transfers hold between their legs (DEBITED or RELEASING): with the balances, a constant."""
        rows = db.query("SELECT COALESCE(SUM(amount), 0) FROM t_transfer WHERE state IN ('DEBITED', 'RELEASING')")
        return int(rows[0][0])
