-- An operator's action that a retry under its Idempotency-Key repeats is one line of the operators' log: the line
-- names what it is about (`<action>:<entry id>`), once (hotledger/ops/store.py: OpsLog.write_once).
ALTER TABLE t_ops_log
  ADD COLUMN subject VARCHAR(80) NULL COMMENT 'what a once-only line is about (<action>:<entry id>), or NULL for any line',
  ADD UNIQUE KEY uq_ops_log_subject (subject);
