-- Issue 20: one ledger of every balance change. Each entry gets the account's next seq under the account row lock
-- (gapless, strictly increasing, never reused: stamped by the DB in commit order, whatever Redis lost or switched),
-- with the balance and the available balance after it, so a statement adds up and a balance at any time is one
-- indexed row. booked_at (epoch ms) never goes back within an account: it is what history and balance-at order by.
ALTER TABLE t_account
  ADD COLUMN seq BIGINT NOT NULL DEFAULT 0 COMMENT 'seq of the account''s last entry in t_entry',
  ADD COLUMN on_hold BIGINT NOT NULL DEFAULT 0 COMMENT 'what active holds keep from available (balance - on_hold)',
  ADD COLUMN booked_at BIGINT NOT NULL DEFAULT 0 COMMENT 'booked_at of the last entry, epoch ms';

CREATE TABLE IF NOT EXISTS t_entry (
  user_id INT NOT NULL,
  seq BIGINT NOT NULL,
  entry_id BIGINT NOT NULL COMMENT 'the change''s id (t_order / t_pay / t_hold_change id, -user_id for an opening)',
  type VARCHAR(24) NOT NULL,
  amount BIGINT NOT NULL COMMENT 'the entry''s own amount, > 0 (an opening: the balance)',
  delta BIGINT NOT NULL COMMENT 'what it added to the balance (negative: taken)',
  balance_after BIGINT NOT NULL,
  available_after BIGINT NOT NULL,
  booked_at BIGINT NOT NULL COMMENT 'epoch ms the DB booked it, never decreases within an account',
  charged_at BIGINT NOT NULL COMMENT 'epoch ms the hot path made the change',
  ref VARCHAR(160) NULL COMMENT 'what caused it: hold:<id>, order:<id>, redpacket:<id>, payment_order:<id>, key:<Idempotency-Key>',
  PRIMARY KEY (user_id, seq),
  UNIQUE KEY uk_entry (entry_id),
  KEY idx_entry_booked (user_id, booked_at, seq),
  KEY idx_entry_type (user_id, type, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- accounts that already hold money start their ledger with one opening entry (their history before this is in
-- t_order / t_pay)
INSERT INTO t_entry (user_id, seq, entry_id, type, amount, delta, balance_after, available_after, booked_at, charged_at)
  SELECT user_id, 1, -user_id, 'opening', balance, balance, balance, balance,
         CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)
  FROM t_account WHERE balance <> 0;
UPDATE t_account SET seq = 1, booked_at = CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED) WHERE balance <> 0;
