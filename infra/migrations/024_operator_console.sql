-- Issue 21: the operator's console. A writer dead letter remembers its replay, so replaying it again does nothing,
-- and every replay an operator makes is logged: who, what, and what came of it.
ALTER TABLE t_dead_letter ADD COLUMN replayed_at BIGINT NULL COMMENT 'epoch ms of its replay (NULL: not replayed)';

CREATE TABLE IF NOT EXISTS t_ops_log (
  id BIGINT NOT NULL AUTO_INCREMENT,
  actor VARCHAR(200) NOT NULL COMMENT 'the caller: the token subject (principalId)',
  action VARCHAR(60) NOT NULL,
  detail TEXT NOT NULL COMMENT 'JSON: what was asked and what came of it',
  created_at BIGINT NOT NULL COMMENT 'epoch ms',
  PRIMARY KEY (id),
  KEY idx_ops_log_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
