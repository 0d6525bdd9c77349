-- Billing tables. Money columns are BIGINT minor units (cents), never DECIMAL-through-float.
CREATE TABLE IF NOT EXISTS t_user (
  id INT NOT NULL AUTO_INCREMENT,
  user_name VARCHAR(128) NOT NULL,
  api_open TINYINT NOT NULL DEFAULT 1,
  close_reason VARCHAR(16) NULL COMMENT 'BALANCE (reopened by a recharge) or ADMIN',
  deduct_type VARCHAR(16) NOT NULL DEFAULT 'ASYNC',
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  modify_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_user_name (user_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_account (
  user_id INT NOT NULL,
  balance BIGINT NOT NULL DEFAULT 0,
  version BIGINT NOT NULL DEFAULT 1 COMMENT 'highest Redis version applied (ASYNC) or DB change count (SYNC)',
  threshold BIGINT NOT NULL DEFAULT 0,
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  modify_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_order (
  id BIGINT NOT NULL,
  user_id INT NOT NULL,
  amount BIGINT NOT NULL,
  balance BIGINT NOT NULL COMMENT 'balance after this order',
  version BIGINT NOT NULL,
  mode VARCHAR(8) NOT NULL COMMENT 'ASYNC or SYNC',
  idem_key VARCHAR(128) NULL,
  create_time DATETIME(3) NOT NULL,
  persist_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_user_time (user_id, create_time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_pay (
  id BIGINT NOT NULL,
  user_id INT NOT NULL,
  pay BIGINT NOT NULL,
  balance BIGINT NOT NULL COMMENT 'balance after this recharge',
  version BIGINT NOT NULL,
  mode VARCHAR(8) NOT NULL,
  idem_key VARCHAR(128) NULL,
  create_time DATETIME(3) NOT NULL,
  persist_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_user_time (user_id, create_time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Idempotency-Key records of the SYNC path, written in the same transaction as the charge.
CREATE TABLE IF NOT EXISTS t_idempotency (
  user_id INT NOT NULL,
  idem_key VARCHAR(128) NOT NULL,
  fingerprint CHAR(64) NOT NULL,
  response TEXT NOT NULL,
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (user_id, idem_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Records the writer could not apply (undecodable, unknown account): kept, not retried forever.
CREATE TABLE IF NOT EXISTS t_dead_letter (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(249) NOT NULL,
  partition_no INT NOT NULL,
  offset_no BIGINT NOT NULL,
  record_key VARBINARY(512) NULL,
  record_value MEDIUMBLOB NULL,
  error VARCHAR(1024) NOT NULL,
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_record (topic, partition_no, offset_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
