-- Issue 32 item 12: a replayed delivery's 3 days of retries count from its replay, not from when its entry was booked
-- (created_at, which the deliveries list and `since` go on showing and filtering by): NULL until replayed.
ALTER TABLE t_webhook_delivery
  ADD COLUMN retry_from BIGINT NULL COMMENT 'epoch ms of its last replay: its retries run for 3 days from then';
