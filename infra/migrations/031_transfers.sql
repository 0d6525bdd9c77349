-- Issue 34: transfers between accounts. A transfer is two ledger charges under the service's own Idempotency-Keys,
-- transferdebit<id> (a deduct of the payer) then transfercredit<id> (a recharge of the payee), made only once the
-- debit is durable; a transfer whose credit is refused for good gives the debit back (transferrelease<id>).
-- PENDING -> DEBITED -> CREDITED -> POSTED (both legs booked in t_entry), or FAILED (the debit refused, or released).
CREATE TABLE IF NOT EXISTS t_transfer (
  id BIGINT NOT NULL,
  from_id INT NOT NULL,
  to_id INT NOT NULL,
  amount BIGINT NOT NULL COMMENT 'minor units of currency',
  currency CHAR(3) NOT NULL,
  description VARCHAR(500) NOT NULL DEFAULT '',
  state VARCHAR(12) NOT NULL COMMENT 'PENDING, DEBITED, CREDITED, POSTED, RELEASING, FAILED',
  debit_id BIGINT NULL COMMENT 'the payer''s deduct',
  credit_id BIGINT NULL COMMENT 'the payee''s recharge',
  release_id BIGINT NULL COMMENT 'the payer''s recharge giving a failed transfer''s debit back',
  failure VARCHAR(300) NULL COMMENT 'code: message of what failed it',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (id),
  KEY idx_transfer_state (state, updated_at),
  KEY idx_transfer_from (from_id, id),
  KEY idx_transfer_to (to_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
