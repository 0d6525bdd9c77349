-- Issue 10: the Idempotency-Keys of the routes outside the ledger's own charges (red packets, payment orders, pay,
-- close, voucher orders of a voucher allowing more than one per user) outlive a Redis loss. One row per (scope, key):
-- the request's fingerprint, the attempt's recovery point (note: the id it reserved before any effect, written
-- before the effect) and, once answered, the answer. Grabs and one-per-user voucher orders keep no row: their answer
-- is rebuilt from their natural key ((packet, user), (voucher, user)).
CREATE TABLE IF NOT EXISTS t_route_key (
  scope VARCHAR(64) NOT NULL COMMENT 'account:<id> or order:<id>',
  idem_key VARCHAR(128) NOT NULL,
  fingerprint CHAR(64) NOT NULL,
  note VARCHAR(64) NULL,
  status SMALLINT NULL COMMENT 'NULL until answered',
  response TEXT NULL,
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (scope, idem_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
