-- Issue 21 follow-up: the sender takes each account's run of due PENDING deliveries per endpoint in one query (a window
-- over the PENDING rows in (endpoint, account, seq, sub_seq) order). This index holds exactly what that window reads,
-- in its order, so the query reads only the PENDING rows and none of their payloads; it replaces (state,
-- next_attempt_at), which only the old one-delivery-per-account query ordered by.
ALTER TABLE t_webhook_delivery DROP KEY idx_delivery_due,
  ADD KEY idx_delivery_run (state, endpoint_id, user_id, seq, sub_seq, next_attempt_at);
