-- Rolled-back changes, for good (issue 10, items 7 and 9): a change whose event the broker did not acknowledge
-- is recorded here by the API before it answers PUBLISH_FAILED, under the same row lock the writer takes to
-- persist it (ledger: the t_account row), so exactly one of the two wins, whatever Redis kept. Persisters skip
-- every id recorded here, whatever its age (a replay from TRIM_HORIZON) and whatever Redis says (a lost
-- tombstone). change_id is the change's snowflake id (ledger: the entry id).
CREATE TABLE IF NOT EXISTS t_rolled_back (
  change_id BIGINT NOT NULL PRIMARY KEY,
  feature VARCHAR(16) NOT NULL,
  owner_id BIGINT NOT NULL,
  create_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB;
