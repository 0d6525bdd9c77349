"""The DB baselines, behind the same handler: what a team would build without Redis, as lean as it can be.

The API handler (routing, validation, authorization context, logging, metrics, the answer) runs unchanged; only the
service call behind the route is replaced, in the worker process, by one DB round trip: a stored procedure that
takes the row lock, writes the entry and commits (with fsync, as the product's DB does), so the lock is held for one
server-side transaction and no client round trip. So the ratios compare like with like: the same clients (in-process
handler calls, one request in flight per process), the same handler, Redis + broker against one DB transaction.

- deduct: `bench_deduct` (UPDATE t_account ... WHERE balance >= amount, INSERT t_order, COMMIT) for Ledger.deduct;
- voucher order: `bench_sale` (UPDATE t_seckill_voucher SET stock = stock - 1 WHERE stock > 0, INSERT
  t_voucher_order, COMMIT; a buyer's second order refused by the unique key) for Vouchers.order.
"""

from __future__ import annotations

import os

PROCEDURES = {
    "bench_deduct": """
CREATE PROCEDURE bench_deduct(IN p_user INT, IN p_amount BIGINT, IN p_id BIGINT)
BEGIN
  DECLARE v_balance BIGINT DEFAULT NULL;
  DECLARE v_version BIGINT DEFAULT NULL;
  START TRANSACTION;
  UPDATE t_account SET balance = balance - p_amount, version = version + 1 WHERE user_id = p_user AND balance >= p_amount;
  IF ROW_COUNT() = 1 THEN
    SELECT balance, version INTO v_balance, v_version FROM t_account WHERE user_id = p_user;
    INSERT INTO t_order (id, user_id, amount, balance, version, mode, create_time)
      VALUES (p_id, p_user, p_amount, v_balance, v_version, 'SYNC', NOW(3));
    COMMIT;
  ELSE
    ROLLBACK;
  END IF;
  SELECT v_balance, v_version;
END""",
    "bench_sale": """
CREATE PROCEDURE bench_sale(IN p_voucher BIGINT, IN p_user BIGINT, IN p_id BIGINT)
BEGIN
  DECLARE v_taken INT DEFAULT 0;
  DECLARE EXIT HANDLER FOR 1062 BEGIN ROLLBACK; SELECT 2; END;
  START TRANSACTION;
  UPDATE t_seckill_voucher SET stock = stock - 1 WHERE id = p_voucher AND stock > 0;
  SET v_taken = ROW_COUNT();
  IF v_taken = 1 THEN
    INSERT INTO t_voucher_order (id, voucher_id, user_id, seq, create_time) VALUES (p_id, p_voucher, p_user, 1, NOW(3));
    COMMIT;
  ELSE
    ROLLBACK;
  END IF;
  SELECT v_taken;
END""",
}


def _connect():
    import pymysql

    from hotledger.config import settings

    cfg = settings()
    return pymysql.connect(
        host=cfg.db_host,
        port=cfg.db_port,
        user=cfg.db_user,
        password=cfg.db_password,
        database=cfg.db_name,
        autocommit=True,
    )


def install() -> None:
    """Create the procedures in the run's schema."""
    conn = _connect()
    with conn.cursor() as cur:
        for name, body in PROCEDURES.items():
            cur.execute(f"DROP PROCEDURE IF EXISTS {name}")
            cur.execute(body)
    conn.close()


def _call(conn, name: str, args: tuple) -> tuple:
    with conn.cursor() as cur:
        cur.execute(f"CALL {name}({', '.join(['%s'] * len(args))})", args)
        row = cur.fetchone()
        while cur.nextset():
            pass
    return row


def patch(kind: str) -> None:
    """In this (worker) process: the handler's service call for `kind` ("deduct" or "sale") becomes the procedure."""
    from hotledger import errors
    from hotledger.ledger import service as ledger_service
    from hotledger.vouchers import service as voucher_service

    conn = _connect()
    os.environ.setdefault("HOTLEDGER_BENCH_BASELINE", kind)
    if kind == "deduct":

        def deduct(self, user_id: int, amount: int, idem_key: str | None = None):
            entry_id = self.next_id()
            balance, version = _call(conn, "bench_deduct", (user_id, amount, entry_id))
            if balance is None:
                raise errors.InsufficientBalance(f"account {user_id}: insufficient balance")
            return ledger_service.LedgerResult(entry_id, user_id, amount, int(balance), int(version), "SYNC")

        ledger_service.Ledger.deduct = deduct
    elif kind == "sale":

        def order(self, voucher_id: int, user_id: int, order_id: int | None = None, reserve=None):
            order_id = order_id or self.next_id()
            (taken,) = _call(conn, "bench_sale", (voucher_id, user_id, order_id))
            if taken == 2:
                raise errors.AlreadyOrdered(f"user {user_id} already ordered voucher {voucher_id}")
            if taken != 1:
                raise errors.SoldOut(f"voucher {voucher_id} is sold out")
            return voucher_service.VoucherOrder(order_id, voucher_id, user_id, 1, "PERSISTED")

        voucher_service.Vouchers.order = order
    else:
        raise ValueError(kind)
