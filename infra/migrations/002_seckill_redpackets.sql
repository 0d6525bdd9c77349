-- Flash-sale vouchers and red packets. Money columns are BIGINT minor units.
CREATE TABLE IF NOT EXISTS t_seckill_voucher (
  id BIGINT NOT NULL AUTO_INCREMENT,
  title VARCHAR(128) NOT NULL,
  initial_stock INT NOT NULL,
  stock INT NOT NULL COMMENT 'left in the DB: initial_stock - orders persisted',
  per_user_limit INT NOT NULL DEFAULT 1,
  begin_time DATETIME(3) NOT NULL,
  end_time DATETIME(3) NOT NULL,
  version BIGINT NOT NULL DEFAULT 0 COMMENT 'bumped by every writer commit that sells from it',
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  CONSTRAINT chk_stock CHECK (stock >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_voucher_order (
  id BIGINT NOT NULL,
  voucher_id BIGINT NOT NULL,
  user_id INT NOT NULL,
  seq INT NOT NULL COMMENT 'the buyer''s n-th order of this voucher (1 .. per_user_limit)',
  create_time DATETIME(3) NOT NULL,
  persist_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_voucher_user_seq (voucher_id, user_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_red_packet (
  id BIGINT NOT NULL,
  sender_id INT NOT NULL,
  total BIGINT NOT NULL,
  item_count INT NOT NULL,
  state VARCHAR(16) NOT NULL COMMENT 'CREATING, OPEN, FAILED, REFUNDING, REFUNDED',
  expires_at DATETIME(3) NOT NULL,
  refund BIGINT NULL,
  debit_order_id BIGINT NULL,
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_state_expires (state, expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_red_packet_item (
  id BIGINT NOT NULL,
  packet_id BIGINT NOT NULL,
  amount BIGINT NOT NULL,
  user_id INT NULL COMMENT 'NULL until grabbed',
  claim_time DATETIME(3) NULL,
  credited TINYINT NOT NULL DEFAULT 0 COMMENT '1 once the grabber''s recharge is in t_pay',
  refunded TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (id),
  UNIQUE KEY uk_packet_user (packet_id, user_id),
  KEY idx_credit (credited, claim_time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- grab credits and packet refunds are recharges keyed by Idempotency-Key: looked up by it
CREATE INDEX idx_pay_idem ON t_pay (idem_key);
