-- Issue 32 item 11: the queue's cost independent of its backlog. A head per (endpoint, account) with PENDING deliveries,
-- indexed by its next attempt: a look at what is due reads the due heads of each endpoint (idx_head_due) and each one's
-- run from its account's first PENDING delivery (idx_delivery_run), never the rows waiting behind them. A head's
-- next_attempt_at is never later than that of its account's first PENDING delivery (earlier only costs a look); the
-- sender moves it on after each run and drops it when none is left. Lock order: the head, then its deliveries.
CREATE TABLE IF NOT EXISTS t_webhook_head (
  endpoint_id BIGINT NOT NULL,
  user_id INT NOT NULL,
  next_attempt_at BIGINT NOT NULL COMMENT 'epoch ms: at or before the next attempt of the account''s first PENDING one',
  PRIMARY KEY (endpoint_id, user_id),
  KEY idx_head_due (endpoint_id, next_attempt_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

INSERT IGNORE INTO t_webhook_head (endpoint_id, user_id, next_attempt_at)
  SELECT endpoint_id, user_id, MIN(next_attempt_at) FROM t_webhook_delivery WHERE state = 'PENDING'
  GROUP BY endpoint_id, user_id;

-- retention (WEBHOOK_RETENTION_DAYS): DELIVERED and DEAD rows pruned by their last attempt (next_attempt_at: a
-- delivered row's is its delivery), and a page of one state's deliveries read in the index's order (created_at, then
-- the key) without sorting the endpoint's history
ALTER TABLE t_webhook_delivery
  ADD KEY idx_delivery_done (state, next_attempt_at),
  ADD KEY idx_delivery_state_created (endpoint_id, state, created_at);
