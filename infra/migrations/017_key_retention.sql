-- Issue 19 item 16: key records are kept for KEY_RETENTION_DAYS; the reconciler deletes older ones oldest first, a
-- bounded batch at a time, which needs their creation time indexed.
CREATE INDEX idx_idempotency_created ON t_idempotency (create_time);
CREATE INDEX idx_route_key_created ON t_route_key (create_time);
CREATE INDEX idx_rolled_back_created ON t_rolled_back (create_time);
