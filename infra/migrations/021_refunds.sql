-- Issue 20: refunds of a charge (a deduct, or what a hold captured), in parts, never more than was charged in total.
-- Each refund is a credit of the account: its ledger row is in t_entry, this table keeps what it refunded.
CREATE TABLE IF NOT EXISTS t_refund (
  id BIGINT NOT NULL COMMENT 'the refund id, its entry id',
  user_id INT NOT NULL,
  charge_id BIGINT NOT NULL COMMENT 'the deduct''s order id or the hold''s id',
  charge_kind VARCHAR(8) NOT NULL COMMENT 'order or hold',
  amount BIGINT NOT NULL,
  version BIGINT NOT NULL,
  reason VARCHAR(500) NULL,
  create_time DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  KEY idx_refund_charge (charge_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
