-- Issue 32 item 6: who may change whose webhook endpoint. An endpoint an operator (admin scope) created is changed
-- (url, types, enabled, secret, replay, delete) by operators only; one a service created by services and operators.
-- Endpoints from before this migration count as a service's (anyone could change them then). Every change is in
-- t_ops_log with its actor.
ALTER TABLE t_webhook_endpoint
  ADD COLUMN operator_owned TINYINT NOT NULL DEFAULT 0 COMMENT '1: created by an operator: only operators change it',
  ADD COLUMN created_by VARCHAR(200) NOT NULL DEFAULT '' COMMENT 'the creator: the token subject (principalId)';
