-- Order-close reminders survive a Redis loss: the reconciler offers again the reminder of every open order
-- that was not reminded yet and is in neither the queue nor its taken set; reminded_at makes a reminder
-- that fires twice (redelivered, or offered again after a loss) write one inbox message.
-- Orders still open at close_at are closed (delay queue 'order-close', the reconciler as the safety net).
ALTER TABLE t_payment_order
  ADD COLUMN remind_at DATETIME(3) NULL COMMENT 'when the close reminder is due',
  ADD COLUMN reminded_at DATETIME(3) NULL COMMENT 'when the close reminder was written to the inbox',
  ADD KEY idx_reminders (state, reminded_at),
  ADD KEY idx_state_close (state, close_at);
