-- Issue 34: an account's currency (ISO 4217), fixed at its creation. Accounts made before it keep NULL, read as the
-- currency DEFAULT_CURRENCY names (the one every balance was kept in so far); new accounts store theirs.
ALTER TABLE t_account
  ADD COLUMN currency CHAR(3) NULL COMMENT 'ISO 4217, NULL: DEFAULT_CURRENCY (accounts created before currencies)';
