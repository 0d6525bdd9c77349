-- Issue 32 item 11: prev_seq survives retention. The last seq fanned out per (endpoint, account), kept apart from the
-- delivery rows the reconciler prunes: the next event's prev_seq names it (before: the highest seq among the rows
-- left, so once they were pruned the next event said null, the first ever). Read and written by the fan-out only.
CREATE TABLE IF NOT EXISTS t_webhook_last (
  endpoint_id BIGINT NOT NULL,
  user_id INT NOT NULL,
  last_seq BIGINT NOT NULL,
  PRIMARY KEY (endpoint_id, user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

INSERT IGNORE INTO t_webhook_last (endpoint_id, user_id, last_seq)
  SELECT endpoint_id, user_id, MAX(seq) FROM t_webhook_delivery GROUP BY endpoint_id, user_id;
