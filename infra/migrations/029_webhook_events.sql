-- Issue 32 item 10: the booking transaction writes one row per event (an entry, or a monitor's crossing of it) that
-- any endpoint subscribes to, whatever the number of endpoints; the webhook sender fans each out to the endpoints'
-- deliveries (t_webhook_delivery, t_webhook_head) in transactions of its own and deletes it. In key order: an account's
-- events are booked in seq order under its lock, so what is committed is a prefix of its seqs.
CREATE TABLE IF NOT EXISTS t_webhook_event (
  user_id INT NOT NULL,
  seq BIGINT NOT NULL,
  sub_seq TINYINT NOT NULL COMMENT '0: the entry, 1, 2, ...: its monitor crossings',
  type VARCHAR(40) NOT NULL,
  at BIGINT NOT NULL COMMENT 'epoch ms: booked',
  source TEXT NOT NULL COMMENT 'the entry or crossing, JSON: each endpoint''s body is made of it with its own prev_seq',
  PRIMARY KEY (user_id, seq, sub_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
