-- Fencing tokens of the distributed lock: a write under the account lock stores its token and refuses a
-- smaller one (an owner whose lease ran out while it was paused).
ALTER TABLE t_account ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;

-- Payment orders with a close time: a reminder is offered to the delay queue, removed on pay or close.
CREATE TABLE IF NOT EXISTS t_payment_order (
  id BIGINT NOT NULL,
  user_id INT NOT NULL,
  amount BIGINT NOT NULL,
  state VARCHAR(8) NOT NULL COMMENT 'OPEN, PAID, CLOSED',
  close_at DATETIME(3) NOT NULL,
  deduct_order_id BIGINT NULL COMMENT 'the billing deduct that paid it',
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  update_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_user (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
