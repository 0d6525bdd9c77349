-- Issue 34: credit grants. t_grant is each grant as the DB knows it (its id is the recharge's entry id); t_grant_spend
-- what each entry spent of which grant; t_grant_expiry each grant-expiry entry (kind G) the writer booked (its ledger
-- row is in t_entry; this table is the writer's duplicate check).
CREATE TABLE IF NOT EXISTS t_grant (
  id BIGINT NOT NULL COMMENT 'the grant id, its recharge entry id',
  user_id INT NOT NULL,
  amount BIGINT NOT NULL,
  remaining BIGINT NOT NULL,
  expires_at BIGINT NOT NULL COMMENT 'epoch ms',
  category VARCHAR(32) NOT NULL,
  state VARCHAR(16) NOT NULL COMMENT 'ACTIVE or EXPIRED',
  PRIMARY KEY (id),
  KEY idx_grant_user_state (user_id, state, expires_at),
  KEY idx_grant_due (state, expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_grant_spend (
  entry_id BIGINT NOT NULL,
  grant_id BIGINT NOT NULL,
  user_id INT NOT NULL,
  amount BIGINT NOT NULL,
  PRIMARY KEY (entry_id, grant_id),
  KEY idx_grant_spend_grant (grant_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_grant_expiry (
  id BIGINT NOT NULL COMMENT 'the expiry''s entry id',
  user_id INT NOT NULL,
  grant_id BIGINT NOT NULL,
  amount BIGINT NOT NULL COMMENT 'what was left of the grant',
  version BIGINT NOT NULL,
  create_time DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_grant_expiry_grant (grant_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
