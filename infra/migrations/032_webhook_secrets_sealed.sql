-- Issue 32 item 7: signing secrets at rest sealed under the stack's KMS key (envelope: 'env1:<the data key, encrypted
-- by KMS>:<nonce and AES-256-GCM ciphertext>', hotledger/webhooks/secrets.py); a 'whsec_' value (from before, or the
-- local runtime's) is read as it is and sealed at its next rotation.
ALTER TABLE t_webhook_endpoint
  MODIFY secret VARCHAR(1024) NOT NULL COMMENT 'sealed (env1:...) or, local only, whsec_<base64>',
  MODIFY previous_secret VARCHAR(1024) NULL COMMENT 'still signed with until previous_until (a rotation overlap)';
