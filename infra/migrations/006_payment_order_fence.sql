-- Payment orders paid or closed exactly once (issue 10, item 6).
-- fence: the highest fencing token of the payment order's lock that took the row (a smaller one is refused, like
-- t_account.fence); pay_started_at: a pay began its charge (a close waits out the payment horizon after it);
-- refund_order_id: the ledger recharge that gave back a charge made after a newer lock owner closed the order.
ALTER TABLE t_payment_order
  ADD COLUMN fence BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN pay_started_at DATETIME(3) NULL,
  ADD COLUMN refund_order_id BIGINT NULL COMMENT 'the ledger recharge that refunded a charge made after the close';

-- the charge of a payment order is found by its Idempotency-Key (payorder<id>) without the 24 h Redis record
CREATE INDEX idx_order_user_idem ON t_order (user_id, idem_key);
