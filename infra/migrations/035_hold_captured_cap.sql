-- Issue 31, hole 1: the DB never holds a hold captured beyond its amount, whatever a Redis loss let the hot path
-- acknowledge: a capture booked past it fails its batch, and the writer dead-letters that one record (counted in
-- LateChangesRefused), never the books. A row a capture made before its authorize was booked (created_at 0, amount
-- 0: holds/tx.py applies changes in any order) is checked once the authorize gives it its amount.
ALTER TABLE t_hold
  ADD CONSTRAINT ck_hold_captured CHECK (captured >= 0 AND (created_at = 0 OR captured <= amount));
