-- Issue 31: an operator's balance adjustment (kinds A, up, and N, down, of ledger/kinds.py), one row per adjustment
-- as t_order keeps a deduct's; its ledger row (t_entry, type 'adjustment') carries the signed delta, the operators'
-- log (t_ops_log) who made it and why.
CREATE TABLE IF NOT EXISTS t_adjustment (
  id BIGINT NOT NULL,
  user_id INT NOT NULL,
  amount BIGINT NOT NULL COMMENT 'what the adjustment moved, > 0: its sign is its ledger row''s delta',
  balance BIGINT NOT NULL COMMENT 'balance after this adjustment',
  version BIGINT NOT NULL,
  mode VARCHAR(8) NOT NULL COMMENT 'ASYNC or SYNC',
  idem_key VARCHAR(128) NULL,
  create_time DATETIME(3) NOT NULL,
  persist_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_user_time (user_id, create_time),
  KEY idx_adjustment_user_idem (user_id, idem_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
