-- Issue 20: holds (authorize, capture, void, expire). t_hold is each hold as the DB knows it, t_hold_change each
-- change of a hold the writer booked (its ledger row is in t_entry; this table is the writer's duplicate check).
CREATE TABLE IF NOT EXISTS t_hold (
  id BIGINT NOT NULL COMMENT 'the hold id, its authorize entry id',
  user_id INT NOT NULL,
  amount BIGINT NOT NULL,
  captured BIGINT NOT NULL DEFAULT 0,
  state VARCHAR(16) NOT NULL COMMENT 'ACTIVE, CAPTURED, VOIDED or EXPIRED',
  expires_at BIGINT NOT NULL COMMENT 'epoch ms',
  created_at BIGINT NOT NULL COMMENT 'epoch ms',
  ended_at BIGINT NULL COMMENT 'epoch ms of the change that ended it',
  description VARCHAR(500) NULL,
  PRIMARY KEY (id),
  KEY idx_hold_user_state (user_id, state, id),
  KEY idx_hold_due (state, expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_hold_change (
  id BIGINT NOT NULL COMMENT 'the change''s entry id',
  user_id INT NOT NULL,
  hold_id BIGINT NOT NULL,
  kind CHAR(1) NOT NULL COMMENT 'H authorize, C capture, V void, X expiry',
  amount BIGINT NOT NULL,
  released BIGINT NOT NULL DEFAULT 0,
  version BIGINT NOT NULL,
  create_time DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  KEY idx_hold_change_hold (hold_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
