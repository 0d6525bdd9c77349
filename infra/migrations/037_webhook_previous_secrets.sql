-- Issue 32: two overlapping rotations. Every old signing secret still within its overlap, not only the last one (a
-- second rotation inside the first one's overlap dropped the first secret at once): a JSON list of
-- [sealed secret, epoch ms it signs until], newest first (hotledger/webhooks/store.py: WebhookStore.rotate).
ALTER TABLE t_webhook_endpoint
  ADD COLUMN previous_secrets TEXT NULL COMMENT 'JSON [[sealed secret, signs until epoch ms], ...], newest first';

UPDATE t_webhook_endpoint SET previous_secrets = JSON_ARRAY(JSON_ARRAY(previous_secret, previous_until))
  WHERE previous_secret IS NOT NULL AND previous_until IS NOT NULL;

ALTER TABLE t_webhook_endpoint DROP COLUMN previous_secret, DROP COLUMN previous_until;
