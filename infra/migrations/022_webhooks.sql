-- Issue 21: webhooks from the durable log. A delivery row is written in the very transaction that books the ledger
-- entry it tells about (t_entry), for each enabled endpoint subscribed to its type: an event exists only for a durable
-- change, and every durable change of a subscribed type has one. (endpoint, account, seq) orders and de-duplicates.
CREATE TABLE IF NOT EXISTS t_webhook_endpoint (
  id BIGINT NOT NULL AUTO_INCREMENT,
  url VARCHAR(2048) NOT NULL,
  event_types VARCHAR(1024) NOT NULL COMMENT 'comma-separated event types',
  description VARCHAR(500) NOT NULL DEFAULT '',
  secret VARCHAR(80) NOT NULL COMMENT 'whsec_<base64>',
  previous_secret VARCHAR(80) NULL COMMENT 'still signed with until previous_until (a rotation overlap)',
  previous_until BIGINT NULL COMMENT 'epoch ms',
  enabled TINYINT NOT NULL DEFAULT 1,
  failing TINYINT NOT NULL DEFAULT 0 COMMENT '1 once an event was dead-lettered after its retries',
  deleted TINYINT NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_webhook_delivery (
  endpoint_id BIGINT NOT NULL,
  user_id INT NOT NULL,
  seq BIGINT NOT NULL COMMENT 'the entry''s seq in the account''s ledger',
  prev_seq BIGINT NULL COMMENT 'the seq of the previous event of this account for this endpoint',
  event_id VARCHAR(64) NOT NULL COMMENT 'stable: evt_<entry id>',
  type VARCHAR(40) NOT NULL,
  payload TEXT NOT NULL COMMENT 'the body as sent, signed as these bytes',
  state VARCHAR(12) NOT NULL COMMENT 'PENDING, DELIVERED or DEAD',
  attempts INT NOT NULL DEFAULT 0,
  next_attempt_at BIGINT NOT NULL,
  last_status INT NULL,
  last_error VARCHAR(500) NULL,
  created_at BIGINT NOT NULL,
  delivered_at BIGINT NULL,
  PRIMARY KEY (endpoint_id, user_id, seq),
  KEY idx_delivery_due (state, next_attempt_at),
  KEY idx_delivery_endpoint_created (endpoint_id, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
