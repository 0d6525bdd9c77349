-- Issue 21: balance monitors with hysteresis, judged where every balance change is booked (the ledger's transaction,
-- under the account row lock, in seq order): one alert per crossing, re-armed only past the re-arm line.
CREATE TABLE IF NOT EXISTS t_balance_monitor (
  id BIGINT NOT NULL AUTO_INCREMENT,
  user_id INT NOT NULL,
  direction VARCHAR(5) NOT NULL COMMENT 'below or above',
  threshold BIGINT NOT NULL COMMENT 'fires when the balance crosses it (below: < threshold, above: > threshold)',
  rearm BIGINT NOT NULL COMMENT 'armed again once the balance is back at or past it (below: >= rearm, above: <= rearm)',
  armed TINYINT NOT NULL,
  deleted TINYINT NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (id),
  KEY idx_monitor_user (user_id, deleted)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_monitor_alert (
  monitor_id BIGINT NOT NULL,
  seq BIGINT NOT NULL COMMENT 'the entry that crossed the line',
  user_id INT NOT NULL,
  direction VARCHAR(5) NOT NULL,
  threshold BIGINT NOT NULL,
  balance BIGINT NOT NULL COMMENT 'the balance after the entry',
  at BIGINT NOT NULL,
  inbox_posted TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (monitor_id, seq),
  KEY idx_alert_unposted (inbox_posted, at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- a crossing's balance.below event has its entry's seq and follows the entry's own event (sub_seq 1)
ALTER TABLE t_webhook_delivery ADD COLUMN sub_seq TINYINT NOT NULL DEFAULT 0 COMMENT '0: the entry, 1: a monitor crossing',
  DROP PRIMARY KEY, ADD PRIMARY KEY (endpoint_id, user_id, seq, sub_seq);
